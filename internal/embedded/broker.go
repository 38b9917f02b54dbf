package embedded

import (
	"context"
	"errors"
	"fmt"
	"net"
	"regexp"
	"slices"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// BrokerConfig is what NewBroker starts.
type BrokerConfig struct {
	// Addr is the host:port the broker listens on and advertises; a port
	// of 0 picks a free one. Empty: 127.0.0.1 on a free port.
	Addr string
	// Topics are created at start, each with Partitions partitions
	// (default 1).
	Topics     []string
	Partitions int32
}

// NewBroker starts a one-node in-process Kafka broker. Its ApiVersions
// answer advertises Produce from version 0, as Apache Kafka 4.0 still does
// (KAFKA-18659), so that producers built on librdkafka detect the
// compression codecs they test Produce v0 for (librdkafka issue 4956):
// with the range starting at 3 they silently send lz4, gzip and snappy
// batches uncompressed. Requests below Produce v3 are still refused, as
// Kafka 4.0 refuses them.
func NewBroker(ctx context.Context, cfg BrokerConfig) (*kfake.Cluster, error) {
	host, port := "127.0.0.1", 0
	if cfg.Addr != "" {
		h, p, err := net.SplitHostPort(cfg.Addr)
		if err != nil {
			return nil, fmt.Errorf("broker address %q: want host:port: %w", cfg.Addr, err)
		}
		if port, err = strconv.Atoi(p); err != nil || port < 0 || port > 65535 {
			return nil, fmt.Errorf("broker address %q: port %q is not a number from 0 to 65535", cfg.Addr, p)
		}
		if h != "" {
			host = h
		}
	}
	partitions := cfg.Partitions
	if partitions < 1 {
		partitions = 1
	}
	opts := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.Ports(port),
		// kfake listens on 127.0.0.1 unless told otherwise; the
		// address asked for is the one it advertises too.
		kfake.ListenFn(func(network, _ string) (net.Listener, error) {
			return net.Listen(network, net.JoinHostPort(host, strconv.Itoa(port)))
		}),
	}
	if len(cfg.Topics) > 0 {
		opts = append(opts, kfake.SeedTopics(partitions, cfg.Topics...))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		return nil, fmt.Errorf("start the embedded broker on %s: %w", net.JoinHostPort(host, strconv.Itoa(port)), err)
	}
	if err := produceFromV0(ctx, c); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// softwareName is what a broker accepts as ApiVersions v3's client software
// name and version.
var softwareName = regexp.MustCompile(`^[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?$`)

// produceFromV0 answers every later ApiVersions request with the cluster's
// own answer, Produce's minimum version lowered to 0. kfake's control hooks
// replace a response rather than edit one, so the cluster's answer is
// fetched once, before the hook is in place.
func produceFromV0(ctx context.Context, c *kfake.Cluster) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		return fmt.Errorf("embedded broker: %w", err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req := kmsg.NewPtrApiVersionsRequest()
	req.ClientSoftwareName = "projector"
	req.ClientSoftwareVersion = "embedded"
	own, err := req.RequestWith(ctx, cl)
	if err != nil {
		return fmt.Errorf("embedded broker: read its ApiVersions: %w", err)
	}
	if own.ErrorCode != 0 {
		return fmt.Errorf("embedded broker: its ApiVersions answered error code %d", own.ErrorCode)
	}
	i := slices.IndexFunc(own.ApiKeys, func(k kmsg.ApiVersionsResponseApiKey) bool { return k.ApiKey == int16(kmsg.Produce) })
	if i < 0 {
		return errors.New("embedded broker: its ApiVersions lists no Produce")
	}
	keys := slices.Clone(own.ApiKeys)
	keys[i].MinVersion = 0
	c.ControlKey(int16(kmsg.ApiVersions), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := kr.(*kmsg.ApiVersionsRequest)
		// What the cluster validates or downgrades (a version above
		// the one fetched, a v5 client naming the cluster it expects,
		// malformed software names) it answers itself.
		if req.Version > own.Version || req.Version >= 5 && (req.ClusterID != nil || req.NodeID != -1) ||
			req.Version >= 3 && (!softwareName.MatchString(req.ClientSoftwareName) || !softwareName.MatchString(req.ClientSoftwareVersion)) {
			return nil, nil, false
		}
		resp := *own
		resp.Version = req.Version
		resp.ApiKeys = slices.Clone(keys)
		return &resp, nil, true
	})
	return nil
}
