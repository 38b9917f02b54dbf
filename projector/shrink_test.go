package projector_test

import (
	"context"
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/projector"
	"github.com/projector-dev/projector/sinks/postgres"
)

// TestStatementTimeoutShrinksTransactions catches up a partition under a
// statement_timeout that a transaction of many batches exceeds and one
// batch does not, and under one that a batch exceeds too: a trigger makes every row written take 4ms, so the
// time a statement takes follows the rows it writes, not the machine's
// speed. Tried unchanged, the transaction would time out for ever; the
// worker commits fewer batches per transaction instead, reaches the log
// end with the table equal to the reference fold, and says once which
// limit it met.
func TestStatementTimeoutShrinksTransactions(t *testing.T) {
	// A batch writes at most 50 rows (0.2s); a transaction of 16 batches
	// up to 400 (1.6s).
	t.Run("batches", func(t *testing.T) { shrinkUnder(t, "600ms") })
	t.Run("records", func(t *testing.T) { shrinkUnder(t, "150ms") })
}

func shrinkUnder(t *testing.T, timeout string) {
	ctx := t.Context()
	opts := demo.DefaultOptions()
	opts.Aggregates, opts.MeanEvents = 400, 4
	f := faultSetup(t, opts, 1)
	for _, q := range []string{
		`CREATE FUNCTION slow_row() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(0.004); RETURN NEW; END $$`,
		`CREATE TRIGGER slow_row BEFORE INSERT OR UPDATE ON accounts FOR EACH ROW EXECUTE FUNCTION slow_row()`,
	} {
		if _, err := f.db.Pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	f.produce(t, f.records)

	u, err := url.Parse(f.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("statement_timeout", timeout)
	u.RawQuery = q.Encode()
	pool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)

	logs := &lockedBuffer{}
	reg := prometheus.NewRegistry()
	cfg := fastRetry
	cfg.BatchMaxRecords, cfg.CommitMaxBatches = 50, 16
	run(t, f.engine(t, "shrink", projector.Config{Partition: cfg, Registerer: reg, Store: postgres.NewStore(pool),
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))}))
	wctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	if err := demo.WaitCommitted(wctx, f.db.Pool, "shrink", f.kafka.Topic, f.end, nil); err != nil {
		t.Fatalf("under statement_timeout: %v\n%s", err, tail(logs.String(), 2000))
	}
	if err := demo.Verify(ctx, f.db.Pool, demo.Table, demo.Fold(f.records)); err != nil {
		t.Fatal(err)
	}
	if n := counter(t, reg, "projector_transaction_shrinks_total"); n < 1 {
		t.Errorf("projector_transaction_shrinks_total = %v, want at least 1", n)
	}
	var said []string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "met a limit") {
			said = append(said, l)
		}
	}
	if len(said) != 1 || !strings.Contains(said[0], "sqlstate=57014") || !strings.Contains(said[0], "setting=statement_timeout") ||
		!strings.Contains(said[0], "value="+timeout) || !strings.Contains(said[0], "--commit-max-batches") {
		t.Errorf("log lines about the limit: %q, want one naming SQLSTATE 57014, statement_timeout = %s and the flags", said, timeout)
	}
}

// tail is the last n bytes of s.
func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
