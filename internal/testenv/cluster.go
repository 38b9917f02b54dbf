package testenv

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// KafkaEnv names the brokers of an Apache Kafka cluster, comma-separated.
// When it is set, the tests that take their cluster from NewCluster run on
// that cluster instead of an embedded one.
const KafkaEnv = "PROJECTOR_TEST_KAFKA_BROKERS"

// RealKafka returns the brokers KafkaEnv names, or nil when the tests run
// on the embedded broker.
func RealKafka() []string {
	var out []string
	for _, b := range strings.Split(os.Getenv(KafkaEnv), ",") {
		if b = strings.TrimSpace(b); b != "" {
			out = append(out, b)
		}
	}
	return out
}

// KafkaSASLEnv names the SASL_PLAINTEXT listeners of the cluster KafkaEnv
// names (scripts/kafka up --sasl): SCRAM-SHA-512 for the user of
// KafkaSASLUser, and OAUTHBEARER with Kafka's unsecured JWT validator.
const KafkaSASLEnv = "PROJECTOR_TEST_KAFKA_SASL_BROKERS"

// The SCRAM-SHA-512 user scripts/kafka up --sasl creates.
const (
	KafkaSASLUser     = "projector"
	KafkaSASLPassword = "projector-secret"
)

// RealKafkaSASL returns the SASL listeners KafkaSASLEnv names, and skips
// the test when there are none: its logins need Apache Kafka.
func RealKafkaSASL(t testing.TB) string {
	t.Helper()
	b := strings.TrimSpace(os.Getenv(KafkaSASLEnv))
	if b == "" || RealKafka() == nil {
		t.Skipf("needs Apache Kafka with a SASL listener (%s and %s, from scripts/kafka up --sasl): runs in scripts/test-kafka", KafkaEnv, KafkaSASLEnv)
	}
	return b
}

// Cluster is the Kafka cluster of one test: the embedded broker, or the
// Apache Kafka cluster KafkaEnv names. On a real cluster the test's topics
// and consumer groups are its own, under names no other test uses, and
// are deleted when the test ends.
type Cluster struct {
	// Fake is the embedded cluster, nil on a real one.
	Fake *kfake.Cluster
	// Topic is the test's topic, created with the partitions asked for.
	Topic string

	t      testing.TB
	addrs  []string
	suffix string
	adm    *kadm.Client
}

// ClusterOpt changes how NewCluster creates the test's topic.
type ClusterOpt func(*clusterConfig)

type clusterConfig struct {
	configs map[string]string
	fake    []kfake.Opt
}

// TopicConfig sets a topic-level config (cleanup.policy, retention.ms…)
// of the test's topic.
func TopicConfig(key, value string) ClusterOpt {
	return func(c *clusterConfig) { c.configs[key] = value }
}

// FakeOpts are options for the embedded cluster; a real one ignores them.
func FakeOpts(opts ...kfake.Opt) ClusterOpt {
	return func(c *clusterConfig) { c.fake = append(c.fake, opts...) }
}

// NewCluster gives the test a cluster with topic created with the given
// partition count. On a real cluster the topic's name is topic with a
// suffix of the test's own (Cluster.Topic): produce to and configure that
// name.
func NewCluster(t testing.TB, topic string, partitions int, opts ...ClusterOpt) *Cluster {
	t.Helper()
	cfg := clusterConfig{configs: map[string]string{}}
	for _, o := range opts {
		o(&cfg)
	}
	c := &Cluster{t: t, Topic: topic}
	if brokers := RealKafka(); brokers != nil {
		c.addrs = brokers
		c.suffix = fmt.Sprintf(".t%x", rand.Uint32())
		c.Topic = topic + c.suffix
		cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
		if err != nil {
			t.Fatalf("kafka admin client: %v", err)
		}
		c.adm = kadm.NewClient(cl)
		t.Cleanup(func() {
			c.deleteOwn()
			cl.Close()
		})
		c.CreateTopic(c.Topic, partitions, cfg.configs)
		return c
	}
	fake, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1)}, cfg.fake...)...)
	if err != nil {
		t.Fatalf("start kfake: %v", err)
	}
	t.Cleanup(fake.Close)
	c.Fake, c.addrs = fake, fake.ListenAddrs()
	c.CreateTopic(topic, partitions, cfg.configs)
	return c
}

// Real reports whether the cluster is Apache Kafka rather than embedded.
func (c *Cluster) Real() bool { return c.Fake == nil }

// Addrs are the cluster's seed brokers.
func (c *Cluster) Addrs() []string { return c.addrs }

// Brokers is Addrs as a --brokers flag value.
func (c *Cluster) Brokers() string { return strings.Join(c.addrs, ",") }

// Name is a topic or group name of the test's own: name itself on the
// embedded cluster, name with the test's suffix on a real one.
func (c *Cluster) Name(name string) string { return name + c.suffix }

// Embedded returns the embedded cluster for a test that needs its request
// hooks, and skips the test on a real cluster, saying why.
func (c *Cluster) Embedded(why string) *kfake.Cluster {
	c.t.Helper()
	if c.Fake == nil {
		c.t.Skipf("needs the embedded broker (%s): runs in make test", why)
	}
	return c.Fake
}

// CreateTopic creates a topic (its name as given) with the cluster's
// default replication, waiting until every partition has a leader.
func (c *Cluster) CreateTopic(topic string, partitions int, configs map[string]string) {
	c.t.Helper()
	if c.Fake != nil {
		if err := c.Fake.CreateTopic(topic, int32(partitions), configs); err != nil {
			c.t.Fatalf("create topic %s: %v", topic, err)
		}
		return
	}
	ctx := context.Background()
	ptrs := map[string]*string{}
	for k, v := range configs {
		ptrs[k] = &v
	}
	// A topic of the same name deleted a moment ago may still be
	// going; the create is retried until the name is free.
	WaitFor(c.t, time.Minute, func() error {
		res, err := c.adm.CreateTopic(ctx, int32(partitions), -1, ptrs, topic)
		if err == nil {
			err = res.Err
		}
		if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
			return fmt.Errorf("create topic %s: %w", topic, err)
		}
		return nil
	})
	WaitFor(c.t, time.Minute, func() error {
		md, err := c.adm.Metadata(ctx, topic)
		if err != nil {
			return err
		}
		td, ok := md.Topics[topic]
		if !ok || td.Err != nil || len(td.Partitions) != partitions {
			return fmt.Errorf("topic %s not ready: %v", topic, td.Err)
		}
		for _, p := range td.Partitions {
			if p.Leader < 0 || p.Err != nil {
				return fmt.Errorf("topic %s partition %d has no leader: %v", topic, p.Partition, p.Err)
			}
		}
		return nil
	})
}

// DeleteTopic deletes a topic and waits until the cluster no longer
// lists it.
func (c *Cluster) DeleteTopic(topic string) {
	c.t.Helper()
	if c.Fake != nil {
		if err := c.Fake.DeleteTopic(topic); err != nil {
			c.t.Fatalf("delete topic %s: %v", topic, err)
		}
		return
	}
	ctx := context.Background()
	if _, err := c.adm.DeleteTopic(ctx, topic); err != nil {
		c.t.Fatalf("delete topic %s: %v", topic, err)
	}
	WaitFor(c.t, time.Minute, func() error {
		topics, err := c.adm.ListTopics(ctx)
		if err != nil {
			return err
		}
		if topics.Has(topic) {
			return fmt.Errorf("topic %s still listed", topic)
		}
		return nil
	})
}

// DeleteRecords moves a partition's log start to before, as retention
// would.
func (c *Cluster) DeleteRecords(topic string, partition int32, before int64) {
	c.t.Helper()
	if c.Fake != nil {
		if err := c.Fake.DeleteRecords(topic, partition, before); err != nil {
			c.t.Fatalf("delete records of %s/%d: %v", topic, partition, err)
		}
		return
	}
	o := kadm.Offsets{}
	o.Add(kadm.Offset{Topic: topic, Partition: partition, At: before})
	res, err := c.adm.DeleteRecords(context.Background(), o)
	if err == nil {
		err = res.Error()
	}
	if err != nil {
		c.t.Fatalf("delete records of %s/%d before %d: %v", topic, partition, before, err)
	}
}

// deleteOwn deletes the test's topics and groups from the real cluster,
// so that a long run does not fill the broker with them.
func (c *Cluster) deleteOwn() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	topics, err := c.adm.ListTopics(ctx)
	if err == nil {
		var own []string
		for _, t := range topics.Names() {
			if strings.HasSuffix(t, c.suffix) {
				own = append(own, t)
			}
		}
		if len(own) > 0 {
			_, _ = c.adm.DeleteTopics(ctx, own...)
		}
	}
	groups, err := c.adm.ListGroups(ctx)
	if err == nil {
		var own []string
		for _, g := range groups.Groups() {
			if strings.HasSuffix(g, c.suffix) {
				own = append(own, g)
			}
		}
		if len(own) > 0 {
			// A group whose members were killed is not empty until their
			// sessions expire; it is left for the broker to expire.
			_, _ = c.adm.DeleteGroups(ctx, own...)
		}
	}
}

// KafkaControlEnv names the command that kills and restarts a node of the
// real cluster: "CMD kill-broker I" and "CMD start-broker I".
const KafkaControlEnv = "PROJECTOR_TEST_KAFKA_CONTROL"

// Nodes skips the test unless it runs on a real cluster of at least n
// brokers whose nodes KafkaControlEnv can kill and restart.
func (c *Cluster) Nodes(n int) {
	c.t.Helper()
	if c.Fake != nil || len(c.addrs) < n || os.Getenv(KafkaControlEnv) == "" {
		c.t.Skipf("needs an Apache Kafka cluster of %d brokers and %s (make test-kafka runs it on one)", n, KafkaControlEnv)
	}
}

// KillBroker kills node i of the real cluster with SIGKILL, keeping its
// data; StartBroker starts it again.
func (c *Cluster) KillBroker(i int) { c.control("kill-broker", i) }

// StartBroker starts node i of the real cluster again.
func (c *Cluster) StartBroker(i int) { c.control("start-broker", i) }

func (c *Cluster) control(verb string, i int) {
	c.t.Helper()
	out, err := exec.Command(os.Getenv(KafkaControlEnv), verb, strconv.Itoa(i)).CombinedOutput()
	if err != nil {
		c.t.Fatalf("%s %d: %v\n%s", verb, i, err, out)
	}
}
