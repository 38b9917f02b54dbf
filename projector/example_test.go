package projector_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/signal"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/projector"
	"github.com/projector-dev/projector/sinks/postgres"
)

// balanceFold is a fold written in Go: it keeps each account's balance and
// how many events touched it, and deletes the row when the account closes.
func balanceFold(state projection.Row, ev projection.Event) (projection.Row, error) {
	row := projection.Row{"account_id": ev.Key, "balance": int64(0), "events": int64(0)}
	if state != nil {
		row["balance"], row["events"] = state["balance"], state["events"]
	}
	amount, _ := ev.Fields["amount"].(int64)
	switch ev.Type {
	case "Deposited":
		row["balance"] = row["balance"].(int64) + amount
	case "Withdrawn":
		row["balance"] = row["balance"].(int64) - amount
	case "AccountClosed":
		return nil, nil // deletes the row
	case "AccountOpened":
	default:
		// Retrying cannot fix an event type this fold does not know.
		return nil, projection.Terminal(errors.New("unknown event type " + ev.Type))
	}
	row["events"] = row["events"].(int64) + 1
	return row, nil
}

// balances is a projection defined in code, with a Go fold. What it
// leaves out takes its default: the key column is named after the key
// field, the version is in field "version", a version beyond the next
// waits for the missing ones.
func balances() *projection.Projection {
	return &projection.Projection{
		Name:      "balances",
		Topic:     "accounts.events",
		Table:     "balances",
		KeyField:  "account_id",
		TypeField: "type",
		Columns: []projection.Column{
			{Name: "account_id", Type: "text", PrimaryKey: true},
			{Name: "balance", Type: "bigint"},
			{Name: "events", Type: "bigint"},
		},
		Fold: balanceFold,
	}
}

// A program that imports the engine as a library registers a Go fold by
// putting it in a projection, then runs the engine until its context ends
// (Stop ends it too). It needs a Kafka cluster, a schema registry and
// Postgres at the addresses it names, so it is compiled but not run.
func Example_goFold() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	if err != nil {
		panic(err)
	}
	registry, err := sr.NewClient(sr.URLs("http://127.0.0.1:8081"))
	if err != nil {
		panic(err)
	}
	p := balances()
	if err := postgres.Migrate(ctx, pool, p); err != nil {
		panic(err)
	}
	decoders, err := projector.RegistryDecoders(ctx, registry, p)
	if err != nil {
		panic(err)
	}
	engine, err := projector.New(projector.Config{
		Brokers:     []string{"127.0.0.1:9092"},
		Identity:    "balances",
		Projections: []*projection.Projection{p},
		Logger:      slog.New(slog.NewJSONHandler(os.Stderr, nil)),
		Store:       postgres.NewStore(pool),
	}, decoders)
	if err != nil {
		panic(err)
	}
	if err := engine.Run(ctx); err != nil {
		panic(err)
	}
}
