package demo

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Account is one expected row of the accounts table.
type Account struct {
	Owner    string
	Balance  int64
	OpenedAt time.Time
	Version  int64
	// Deposits counts the Deposited events applied since the account
	// was opened: what a projection with a deposits column counts.
	Deposits int64
}

// Expected is the reference fold of a stream: what the tables must hold.
type Expected struct {
	Accounts map[string]Account
	// Snapshots holds, per account with a row, the event its row was last
	// built from: what a snapshot projection's row holds.
	Snapshots map[string]Event
	// Applied counts the events that apply (each version once) and the
	// tombstones; Stale the copies that must be ignored; Parked the events
	// stuck behind a version that never arrives; Poison the records that
	// are dead-lettered: poison pills, tombstones without a key, and
	// events whose record key is not their account.
	Applied, Stale, Parked, Poison int
	// Deleted counts accounts that were closed or deleted by a tombstone
	// and have no row.
	Deleted int
}

// Dead reports whether the engine must dead-letter r rather than apply it.
func (r Record) Dead() bool {
	switch {
	case r.Poison != "":
		return true
	case r.Tombstone:
		return r.Key == ""
	default:
		return r.Key != r.Event.AccountID
	}
}

// Fold computes the expected state of a stream by hand, independently of
// the engine: per account, in the order of the stream, version v applies
// once every one of 1..v-1 has; other copies are stale; versions beyond a
// missing one stay parked. A tombstone deletes the row the versions
// applied so far have built, and keeps the version: a later copy of an
// applied version is stale, the next version builds a new row.
func Fold(records []Record) Expected {
	type agg struct {
		seen    map[int64]Event // every version that arrived, first copy
		applied int64
		acc     Account
		last    Event
		exists  bool
	}
	byAgg := map[string]*agg{}
	exp := Expected{Accounts: map[string]Account{}, Snapshots: map[string]Event{}}
	copies := 0
	get := func(key string) *agg {
		a := byAgg[key]
		if a == nil {
			a = &agg{seen: map[int64]Event{}}
			byAgg[key] = a
		}
		return a
	}
	for _, r := range records {
		if r.Dead() {
			exp.Poison++
			continue
		}
		a := get(r.Key)
		if r.Tombstone {
			exp.Applied++
			a.exists, a.acc = false, Account{Version: a.applied}
			continue
		}
		copies++
		if _, dup := a.seen[r.Event.Version]; dup {
			continue
		}
		a.seen[r.Event.Version] = r.Event
		for {
			ev, ok := a.seen[a.applied+1]
			if !ok {
				break
			}
			switch ev.Type {
			case "AccountOpened":
				a.acc.Owner, a.acc.OpenedAt, a.exists = ev.Owner, ev.OccurredAt, true
			case "Deposited":
				a.acc.Balance += ev.Amount
				a.acc.Deposits++
				a.exists = true
			case "Withdrawn":
				a.acc.Balance -= ev.Amount
				a.exists = true
			case "AccountClosed":
				a.exists, a.acc = false, Account{}
			}
			a.applied++
			a.acc.Version, a.last = a.applied, ev
			exp.Applied++
		}
	}
	distinct := 0
	for id, a := range byAgg {
		distinct += len(a.seen)
		exp.Parked += len(a.seen) - int(a.applied)
		switch {
		case a.exists:
			exp.Accounts[id] = a.acc
			exp.Snapshots[id] = a.last
		case a.applied > 0:
			exp.Deleted++
		}
	}
	exp.Stale = copies - distinct
	return exp
}

// Verify compares the accounts table with the expected fold and returns a
// readable list of the differences (at most 10 are spelled out).
func Verify(ctx context.Context, pool *pgxpool.Pool, table string, exp Expected) error {
	rows, err := pool.Query(ctx, fmt.Sprintf(`SELECT account_id, coalesce(owner, ''), balance, opened_at, version FROM %s`, table))
	if err != nil {
		return fmt.Errorf("read %s: %w", table, err)
	}
	defer rows.Close()
	got := map[string]Account{}
	for rows.Next() {
		var (
			id     string
			a      Account
			opened *time.Time
		)
		if err := rows.Scan(&id, &a.Owner, &a.Balance, &opened, &a.Version); err != nil {
			return fmt.Errorf("read %s: %w", table, err)
		}
		if opened != nil {
			a.OpenedAt = opened.UTC()
		}
		got[id] = a
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read %s: %w", table, err)
	}
	var diffs []string
	for id, want := range exp.Accounts {
		g, ok := got[id]
		switch {
		case !ok:
			diffs = append(diffs, fmt.Sprintf("%s: missing, want %+v", id, want))
		case g.Owner != want.Owner || g.Balance != want.Balance || g.Version != want.Version || !g.OpenedAt.Equal(want.OpenedAt):
			diffs = append(diffs, fmt.Sprintf("%s: got %+v, want %+v", id, g, want))
		}
	}
	for id, g := range got {
		if _, ok := exp.Accounts[id]; !ok {
			diffs = append(diffs, fmt.Sprintf("%s: unexpected row %+v", id, g))
		}
	}
	if len(diffs) == 0 {
		return nil
	}
	slices.Sort(diffs)
	n := len(diffs)
	if len(diffs) > 10 {
		diffs = diffs[:10]
	}
	return fmt.Errorf("%s differs from the reference fold in %d rows (%d expected, %d found):\n  %s",
		table, n, len(exp.Accounts), len(got), strings.Join(diffs, "\n  "))
}
