package projector_test

import (
	"strings"
	"testing"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/projector"
)

// Projections of one topic that read the same fields share one decoder,
// so that their worker decodes each record once; a projection reading
// other fields, or another topic, has its own.
func TestPrunedDecodersShareEqualReaders(t *testing.T) {
	files, err := demo.Schemas()
	if err != nil {
		t.Fatal(err)
	}
	reader, err := avro.Parse(files["account_event"])
	if err != nil {
		t.Fatal(err)
	}
	fold, err := projection.Parse(demo.Projections, ".")
	if err != nil {
		t.Fatal(err)
	}
	second := strings.NewReplacer("name: last_event", "name: last_event_copy", "table: last_event", "table: last_event_copy").
		Replace(string(demo.SnapshotProjections))
	other := strings.NewReplacer("name: last_event", "name: elsewhere", "table: last_event", "table: elsewhere", "topic: "+demo.Topic, "topic: elsewhere").
		Replace(string(demo.SnapshotProjections))
	var projs []*projection.Projection
	for _, file := range []string{string(demo.SnapshotProjections), second, other} {
		ps, err := projection.Parse([]byte(file), ".")
		if err != nil {
			t.Fatal(err)
		}
		projs = append(projs, ps...)
	}
	projs = append(projs, fold[0])
	readers := map[string]avro.Schema{}
	for _, p := range projs {
		readers[p.Name] = reader
	}
	cl, err := sr.NewClient(sr.URLs("http://127.0.0.1:1"))
	if err != nil {
		t.Fatal(err)
	}
	decoderOf := projector.PrunedDecoders(cl, readers)
	snap, snapCopy, elsewhere, accounts := decoderOf(projs[0]), decoderOf(projs[1]), decoderOf(projs[2]), decoderOf(projs[3])
	if snap != snapCopy {
		t.Error("two projections of one topic reading the same fields got two decoders")
	}
	if snap == elsewhere {
		t.Error("projections of two topics share a decoder")
	}
	if snap == accounts {
		t.Error("projections reading different fields share a decoder")
	}
}
