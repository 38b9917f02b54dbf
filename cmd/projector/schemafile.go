package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/hamba/avro/v2"

	"github.com/projector-dev/projector/internal/schemafile"
)

// readSchemaFile reads and parses the Avro schema file path, given by a
// flag. Its errors name the file and, for what it holds, a line and
// column, but never quote it: a flag pointed at the wrong file must not
// print that file.
func readSchemaFile(path string) ([]byte, avro.Schema, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err // names the file
	}
	defer f.Close()
	b, s, err := schemafile.Read(f)
	if errors.Is(err, schemafile.ErrNotSchema) {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	if err != nil {
		return nil, nil, err // a read error, which names the file
	}
	return b, s, nil
}
