package embedded

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestBrokerAdvertisesProduceFromV0 asks the embedded broker for its API
// versions at every version a client may use: librdkafka decides which
// compression codecs the broker takes from whether Produce's range starts
// at 0, so each answer must start there, and every other key must be as
// the broker itself advertises it.
func TestBrokerAdvertisesProduceFromV0(t *testing.T) {
	c, err := NewBroker(t.Context(), BrokerConfig{Topics: []string{"t"}, Partitions: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for v := int16(0); v <= 4; v++ {
		req := kmsg.NewPtrApiVersionsRequest()
		req.Version = v
		req.ClientSoftwareName, req.ClientSoftwareVersion = "librdkafka", "2.0.2"
		br := cl.Broker(0)
		resp, err := br.Request(t.Context(), req)
		if err != nil {
			t.Fatalf("ApiVersions v%d: %v", v, err)
		}
		av := resp.(*kmsg.ApiVersionsResponse)
		if av.ErrorCode != 0 {
			t.Fatalf("ApiVersions v%d: error code %d", v, av.ErrorCode)
		}
		var produce, fetch *kmsg.ApiVersionsResponseApiKey
		for i, k := range av.ApiKeys {
			switch k.ApiKey {
			case int16(kmsg.Produce):
				produce = &av.ApiKeys[i]
			case int16(kmsg.Fetch):
				fetch = &av.ApiKeys[i]
			}
		}
		if produce == nil || produce.MinVersion != 0 || produce.MaxVersion < 7 {
			t.Errorf("ApiVersions v%d: Produce %+v, want versions from 0 to at least 7", v, produce)
		}
		if fetch == nil || fetch.MaxVersion < 11 {
			t.Errorf("ApiVersions v%d: Fetch %+v, want the broker's own range", v, fetch)
		}
	}

	// A franz-go client still produces and fetches through it.
	if err := cl.ProduceSync(t.Context(), &kgo.Record{Topic: "t", Value: []byte("x")}).FirstErr(); err != nil {
		t.Fatalf("produce after the ApiVersions answers: %v", err)
	}
}
