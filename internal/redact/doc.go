// Package redact masks secrets in text meant for people: connection URLs
// and strings, error messages that quote them, and log attributes.
//
// It owns one rule for what a secret is, so that every command prints the
// same masked form: the password of a URL's userinfo (with or without a
// scheme: user:password@host is masked too, since it does not rest on a
// URL parser reading it as a URL), the values of query
// parameters that carry credentials (password, sslpassword, token,
// api_key and the like), and password and sslpassword in a Postgres
// keyword/value connection string.
//
// It also bounds what such text quotes of record data (Clip): a key or
// value of any length is quoted by its first few hundred bytes and its
// length, so that a 100 KB key costs a log line or a table cell no more
// than a short one.
//
// It does not keep secrets out of places that are not text: a secret
// handed to a child process goes through its environment or stdin, and a
// secret handed to a client goes through that client's own option (such
// as the registry's basic auth), never inside a URL it may quote.
package redact
