package projection

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"

	"go.yaml.in/yaml/v3"
)

// A Definition is what of a projection decides the rows of its table: its
// topic, table, key, version, mode, columns, events and gap policy, and
// the reader schema. It leaves out how the projection is run (gap
// timeout, repair source, fillfactor, tombstone retention, the read
// API's filterable and tenant columns), which each deployment's file sets, and which may hold secrets. Stored with a
// generation of the projection, it lets every replica compile the same
// projection whatever file it was started with.
type Definition struct {
	// YAML is the projection as a projection file of one projection.
	YAML []byte
	// Schema is the reader schema (Avro JSON); empty: the latest
	// registered for the topic.
	Schema string
}

// ErrNoDefinition reports a projection built in Go rather than read from
// a projection file: there is no definition to store.
var ErrNoDefinition = errors.New("projection has no file definition (built in Go): generations need a projection file")

// Definition returns the projection's definition.
func (p *Projection) Definition() (Definition, error) {
	if p.spec == nil {
		return Definition{}, fmt.Errorf("projection %q: %w", p.Name, ErrNoDefinition)
	}
	s := *p.spec
	s.Schema, s.GapTimeout, s.Repair, s.Fillfactor, s.TombstoneRetention = "", "", nil, 0, ""
	s.Filterable, s.Tenant = nil, ""
	b, err := yaml.Marshal(File{Projections: []Spec{s}})
	if err != nil {
		return Definition{}, fmt.Errorf("projection %q: definition: %w", p.Name, err)
	}
	return Definition{YAML: b, Schema: p.Schema}, nil
}

// Hash identifies the definition: two definitions with the same hash
// compile to projections that write the same rows.
func (d Definition) Hash() string {
	h := sha256.New()
	h.Write(d.YAML)
	h.Write([]byte{0})
	h.Write([]byte(d.Schema))
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// Equal reports whether d and o define the same projection.
func (d Definition) Equal(o Definition) bool {
	return bytes.Equal(d.YAML, o.YAML) && d.Schema == o.Schema
}

// Compile builds the projection d defines. How it runs (gap timeout,
// repair source, fillfactor, tombstone retention) comes from run, the
// projection of the same name in the deployment's file. With run nil the
// defaults apply and a projection whose gaps are repaired has no repair
// source: good for checking the definition, not for running it.
func (d Definition) Compile(run *Projection) (*Projection, error) {
	var f File
	dec := yaml.NewDecoder(bytes.NewReader(d.YAML))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("stored definition: %w", yamlError(err, nil))
	}
	if len(f.Projections) != 1 {
		return nil, fmt.Errorf("stored definition: want one projection, found %d", len(f.Projections))
	}
	s := f.Projections[0]
	if run != nil && run.spec != nil {
		s.GapTimeout, s.Repair, s.Fillfactor, s.TombstoneRetention = run.spec.GapTimeout, run.spec.Repair, run.spec.Fillfactor, run.spec.TombstoneRetention
		s.Filterable, s.Tenant = run.spec.Filterable, run.spec.Tenant
	} else {
		s.withoutRepair = true
	}
	s.Schema = ""
	p, err := s.compile("")
	if err != nil {
		return nil, err
	}
	p.Schema = d.Schema
	return p, nil
}
