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
}

// Expected is the reference fold of a stream: what the tables must hold.
type Expected struct {
	Accounts map[string]Account
	// Applied counts the events that apply (each version once); Stale the
	// copies that must be ignored; Parked the events stuck behind a
	// version that never arrives; Poison the poison pills.
	Applied, Stale, Parked, Poison int
	// Deleted counts closed accounts.
	Deleted int
}

// Fold computes the expected state of a stream by hand, independently of
// the engine: per account, versions 1..k apply in order where every one of
// 1..k is present; other copies are stale; versions beyond a missing one
// stay parked.
func Fold(records []Record) Expected {
	byAgg := map[string]map[int64]Event{}
	exp := Expected{Accounts: map[string]Account{}}
	copies := 0
	for _, r := range records {
		if r.Poison != "" {
			exp.Poison++
			continue
		}
		copies++
		m := byAgg[r.Key]
		if m == nil {
			m = map[int64]Event{}
			byAgg[r.Key] = m
		}
		if _, dup := m[r.Event.Version]; !dup {
			m[r.Event.Version] = r.Event
		}
	}
	distinct := 0
	for id, versions := range byAgg {
		distinct += len(versions)
		var (
			acc    Account
			exists bool
		)
		v := int64(1)
		for ; ; v++ {
			ev, ok := versions[v]
			if !ok {
				break
			}
			switch ev.Type {
			case "AccountOpened":
				acc.Owner, acc.OpenedAt, exists = ev.Owner, ev.OccurredAt, true
			case "Deposited":
				acc.Balance += ev.Amount
			case "Withdrawn":
				acc.Balance -= ev.Amount
			case "AccountClosed":
				exists = false
			}
			acc.Version = v
		}
		exp.Applied += int(v - 1)
		exp.Parked += len(versions) - int(v-1)
		if exists {
			exp.Accounts[id] = acc
		} else if v > 1 {
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
