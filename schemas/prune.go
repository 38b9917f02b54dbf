package schemas

import (
	"slices"

	"github.com/hamba/avro/v2"
)

// Prune returns a record reader schema keeping only the fields named in
// keep, so that decoding skips the others (writer fields the reader lacks
// are skipped without being decoded into values); with keep nil, or a
// reader that is not a record, it returns reader. The record keeps its name
// and aliases, so writer schemas resolve against it as against reader.
func Prune(reader avro.Schema, keep []string) avro.Schema {
	rec, ok := reader.(*avro.RecordSchema)
	if !ok || keep == nil {
		return reader
	}
	var fields []*avro.Field
	for _, f := range rec.Fields() {
		if slices.Contains(keep, f.Name()) {
			fields = append(fields, f)
		}
	}
	if len(fields) == len(rec.Fields()) {
		return reader
	}
	pruned, err := avro.NewRecordSchema(rec.Name(), rec.Namespace(), fields,
		avro.WithAliases(rec.Aliases()), avro.WithDoc(rec.Doc()))
	if err != nil {
		return reader // cannot happen: the name was valid in reader
	}
	return pruned
}
