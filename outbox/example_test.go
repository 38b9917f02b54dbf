package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"

	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/outbox"
)

// openAccount is a service's write: its own table and the event, in the
// caller's transaction.
func openAccount(ctx context.Context, tx pgx.Tx, id, owner string) error {
	if _, err := tx.Exec(ctx, `INSERT INTO accounts (id, owner, version) VALUES ($1, $2, 1)`, id, owner); err != nil {
		return err
	}
	return outbox.Append(ctx, tx, outbox.Event{
		AggregateType: "account",
		AggregateID:   id,
		Version:       1,
		Type:          "AccountOpened",
		Topic:         "accounts.events",
		// Encoded with the latest schema of "accounts.events-value" when
		// the relay publishes it.
		Value: map[string]any{"account_id": id, "version": 1, "type": "AccountOpened", "owner": owner},
	})
}

// A service changes its own table and appends the event in one
// transaction: both commit, or neither does. The relay (projector relay)
// publishes what committed.
func ExampleAppend() {
	ctx := context.Background()
	pool, cleanup, err := exampleDatabase(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cleanup()
	if err := outbox.Migrate(ctx, pool); err != nil {
		fmt.Println(err)
		return
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE accounts (id text PRIMARY KEY, owner text, version bigint)`); err != nil {
		fmt.Println(err)
		return
	}

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return openAccount(ctx, tx, "acc-1", "Ada") })
	fmt.Println("committed:", err)
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := openAccount(ctx, tx, "acc-2", "Bob"); err != nil {
			return err
		}
		return errors.New("the business rule failed")
	})
	fmt.Println("rolled back:", err)

	var pending int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM projector_outbox WHERE published_at IS NULL`).Scan(&pending); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("events waiting for the relay:", pending)
	// Output:
	// committed: <nil>
	// rolled back: the business rule failed
	// events waiting for the relay: 1
}

// accountSchema is the topic's value schema, registered under
// "accounts.events-value".
const accountSchema = `{"type": "record", "name": "AccountEvent", "fields": [
	{"name": "account_id", "type": "string"},
	{"name": "version", "type": "long"},
	{"name": "type", "type": "string"},
	{"name": "owner", "type": "string"}]}`

// The relay publishes what committed to the outbox, in order per
// aggregate, encoded with the topic's latest registered schema and with
// CloudEvents headers; a consumer (the projector) reads it from Kafka.
func ExampleRelay() {
	ctx := context.Background()
	pool, cleanup, err := exampleDatabase(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cleanup()
	if err := outbox.Migrate(ctx, pool); err != nil {
		fmt.Println(err)
		return
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE accounts (id text PRIMARY KEY, owner text, version bigint)`); err != nil {
		fmt.Println(err)
		return
	}

	// An in-process broker and registry stand in for the real ones.
	kafka, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "accounts.events"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer kafka.Close()
	fakeRegistry := srfake.New()
	defer fakeRegistry.Close()
	registry, err := sr.NewClient(sr.URLs(fakeRegistry.URL()))
	if err != nil {
		fmt.Println(err)
		return
	}
	if _, err := registry.CreateSchema(ctx, "accounts.events-value", sr.Schema{Schema: accountSchema}); err != nil {
		fmt.Println(err)
		return
	}
	producer, err := kgo.NewClient(kgo.SeedBrokers(kafka.ListenAddrs()...), kgo.ProducerLinger(0))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer producer.Close()

	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return openAccount(ctx, tx, "acc-1", "Ada") }); err != nil {
		fmt.Println(err)
		return
	}

	relay, err := outbox.New(pool, outbox.Config{Client: producer, Registry: registry, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		fmt.Println(err)
		return
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(runCtx) }()
	defer func() {
		stop()
		<-done
	}()

	consumer, err := kgo.NewClient(kgo.SeedBrokers(kafka.ListenAddrs()...), kgo.ConsumeTopics("accounts.events"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer consumer.Close()
	pollCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	fetches := consumer.PollRecords(pollCtx, 1)
	if err := fetches.Err(); err != nil {
		fmt.Println(err)
		return
	}
	rec := fetches.Records()[0]
	fmt.Println("key:", string(rec.Key))
	for _, h := range rec.Headers {
		if h.Key == outbox.HeaderCEType {
			fmt.Println("ce_type:", string(h.Value))
		}
	}
	// The value is Avro after the wire format's magic byte and schema id.
	var event map[string]any
	if err := avro.Unmarshal(avro.MustParse(accountSchema), rec.Value[5:], &event); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("owner:", event["owner"], "version:", event["version"])
	// Output:
	// key: acc-1
	// ce_type: AccountOpened
	// owner: Ada version: 1
}

// exampleDatabase gives the example a schema of its own in the test
// database.
func exampleDatabase(ctx context.Context) (*pgxpool.Pool, func(), error) {
	admin, err := pgxpool.New(ctx, testenv.DatabaseURL())
	if err != nil {
		return nil, nil, err
	}
	if _, err := admin.Exec(ctx, `DROP SCHEMA IF EXISTS example_outbox CASCADE; CREATE SCHEMA example_outbox`); err != nil {
		admin.Close()
		return nil, nil, err
	}
	u, _ := url.Parse(testenv.DatabaseURL())
	q := u.Query()
	q.Set("search_path", "example_outbox")
	u.RawQuery = q.Encode()
	pool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		admin.Close()
		return nil, nil, err
	}
	return pool, func() {
		pool.Close()
		_, _ = admin.Exec(ctx, `DROP SCHEMA example_outbox CASCADE`)
		admin.Close()
	}, nil
}
