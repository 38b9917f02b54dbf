package redact

import (
	"strconv"
	"unicode/utf8"
)

// MaxQuoted is the most bytes of a record's key or value, or of a text
// quoting one, that a log line, an error or a command's table quotes.
const MaxQuoted = 256

// MaxLogged is the most bytes of one string or error a log line carries
// through ReplaceAttr: errors quote data among other words, each quote
// bounded by MaxQuoted, and this bounds what a quote forgot.
const MaxLogged = 4096

// Clip bounds data quoted for people: s itself when it is at most
// MaxQuoted bytes, else its first MaxQuoted bytes (cut at a character's
// start), an ellipsis and how long the whole was, as in
// `aaaa… (100000 bytes)`. A key or value of any length then costs a log
// line, an error or a table cell a few hundred bytes.
func Clip(s string) string { return ClipTo(s, MaxQuoted) }

// ClipTo is Clip with a bound of most bytes, for texts that quote data
// among other words, such as a database's error message.
func ClipTo(s string, most int) string {
	if len(s) <= most {
		return s
	}
	end := most
	for end > 0 && !utf8.RuneStart(s[end]) {
		end--
	}
	return s[:end] + "… (" + strconv.Itoa(len(s)) + " bytes)"
}
