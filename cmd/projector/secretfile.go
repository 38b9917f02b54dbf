package main

import (
	"errors"
	"fmt"
	"os"
	"strings"
)

// secretFile is a flag that names a file holding a secret, such as a
// Kubernetes secret mounted as a volume: the file is read again each time
// the secret is used (a login, a new connection, a request), so that a
// secret rotated in place reaches the next use without a restart.
type secretFile struct {
	flag string // "--kafka-sasl-password-file"
	path string
}

// read returns the file's content without its trailing line ending, the
// way a secret written by echo or a text editor is meant. The errors name
// the flag and the path, never the content.
func (s secretFile) read() (string, error) {
	b, err := os.ReadFile(s.path)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err // the path is said once, below
		}
		return "", fmt.Errorf("%s %s (%s): %w", s.flag, s.path, envName(s.flag), err)
	}
	v := strings.TrimRight(string(b), "\r\n")
	if v == "" {
		return "", fmt.Errorf("%s %s (%s): the file is empty", s.flag, s.path, envName(s.flag))
	}
	return v, nil
}

// envName is the variable of a flag shared by every command (its name
// with the dashes), for the errors that name both.
func envName(flag string) string {
	return envPrefix + envWord(strings.TrimPrefix(flag, "--"))
}

// oneSecret returns the secretFile of fileFlag=path, checked readable, or
// nil when path is empty. Given both the secret (value not empty) and the
// file it is refused: which one counts would otherwise be a guess.
func oneSecret(secretFlag, value, fileFlag, path string) (*secretFile, error) {
	if path == "" {
		return nil, nil
	}
	if value != "" {
		return nil, fmt.Errorf("both %s (%s) and %s (%s) are given: give one, the file to have a rotated secret read at its next use",
			secretFlag, envName(secretFlag), fileFlag, envName(fileFlag))
	}
	f := &secretFile{flag: fileFlag, path: path}
	if _, err := f.read(); err != nil {
		return nil, err
	}
	return f, nil
}
