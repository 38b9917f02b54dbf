// Package stopsignal turns the signals that end a long-running command
// (SIGINT, SIGTERM and SIGHUP) into the end of a context, and says in one
// log line when the signal was SIGHUP: the commands stop on it as on
// SIGTERM (commit what is planned, leave the group), since projector does
// not reload its configuration and a closed terminal must not kill a
// member without its shutdown.
//
// It must not decide what stopping means: the command whose context ends
// does.
package stopsignal
