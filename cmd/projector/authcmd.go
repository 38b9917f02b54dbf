package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/peterbourgon/ff/v3/ffcli"

	"github.com/projector-dev/projector/auth"
)

func authCommand(stdin io.Reader, stdout, stderr io.Writer) *ffcli.Command {
	fs := flag.NewFlagSet("projector auth", flag.ContinueOnError)
	fs.SetOutput(stderr)
	return &ffcli.Command{
		Name:       "auth",
		ShortUsage: "projector auth <new-token|hash-token>",
		ShortHelp:  "Make the API tokens of a token file (--auth tokens): a new random token, or the hash of a token.",
		FlagSet:    fs,
		Subcommands: []*ffcli.Command{
			authNewTokenCommand(stdout, stderr),
			authHashTokenCommand(stdin, stdout, stderr),
		},
		Exec: func(context.Context, []string) error { return flag.ErrHelp },
	}
}

func authNewTokenCommand(stdout, stderr io.Writer) *ffcli.Command {
	return newCommand("new-token", "projector auth new-token",
		"Print a new random token (256 bits) and the hash line of the token file that accepts it: give the token to the caller, keep the hash.", stderr,
		func(*flag.FlagSet) {},
		func(context.Context, []string) error {
			token, err := auth.NewToken()
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(stdout, "token: %s\nhash: %s\n", token, auth.HashToken(token))
			return err
		})
}

func authHashTokenCommand(stdin io.Reader, stdout, stderr io.Writer) *ffcli.Command {
	return newCommand("hash-token", "projector auth hash-token (reads the token from stdin)",
		"Read a token from stdin (its first line) and print the hash a token file stores for it; the token is not taken as an argument, which would leave it in the shell's history and the process list.", stderr,
		func(*flag.FlagSet) {},
		func(_ context.Context, args []string) error {
			if len(args) > 0 {
				return &usageError{msg: "hash-token reads the token from stdin, not from its arguments: printf %s \"$TOKEN\" | projector auth hash-token"}
			}
			line, err := bufio.NewReader(stdin).ReadString('\n')
			if err != nil && !errors.Is(err, io.EOF) {
				return fmt.Errorf("read the token from stdin: %w", err)
			}
			token := strings.TrimRight(line, "\r\n")
			if token == "" {
				return errors.New("no token on stdin: printf %s \"$TOKEN\" | projector auth hash-token")
			}
			if strings.TrimSpace(token) != token {
				return errors.New("the token on stdin begins or ends with spaces, which a bearer header would not carry: hash the token alone")
			}
			_, err = fmt.Fprintf(stdout, "hash: %s\n", auth.HashToken(token))
			return err
		})
}
