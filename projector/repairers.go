package projector

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projector-dev/projector/partition"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/repair"
)

// repairerOf returns the repair source of a projection with on_gap repair:
// nil for a SQL source, which it checks and Run opens.
func (e *Engine) repairerOf(p *projection.Projection) (partition.Repairer, error) {
	if r := e.cfg.Repairers[p.Name]; r != nil {
		return r, nil
	}
	spec := p.Repair
	switch {
	case spec == nil:
		return nil, fmt.Errorf("projection %q: on_gap repair needs a repair source (Config.Repairers or the projection's repair:)", p.Name)
	case spec.HTTPURL != "":
		r, err := repair.NewHTTP(repair.HTTPConfig{URL: spec.HTTPURL, Timeout: spec.HTTPTimeout}, nil)
		if err != nil {
			return nil, fmt.Errorf("projection %q: repair.http: %w", p.Name, err)
		}
		return r, nil
	}
	pc, err := pgxpool.ParseConfig(spec.SQLDatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("projection %q: repair.sql.database_url: %w", p.Name, err)
	}
	if strings.TrimSpace(spec.SQLQuery) == "" {
		return nil, fmt.Errorf("projection %q: repair.sql: query is required", p.Name)
	}
	// The pool connects, so Run opens it.
	e.sqlRepairs = append(e.sqlRepairs, sqlRepair{topic: p.Topic, projection: p.Name, pool: pc, query: spec.SQLQuery})
	return nil, nil
}

// sqlRepair is a SQL repair source New has checked and Run opens.
type sqlRepair struct {
	topic, projection string
	pool              *pgxpool.Config
	query             string
}

// openSQLRepairs opens the pools of the SQL repair sources New checked;
// e.close closes them.
func (e *Engine) openSQLRepairs(ctx context.Context) error {
	for _, r := range e.sqlRepairs {
		pool, err := pgxpool.NewWithConfig(ctx, r.pool)
		if err != nil {
			return fmt.Errorf("projection %q: repair.sql.database_url: %w", r.projection, err)
		}
		e.closers = append(e.closers, pool.Close)
		rep, err := repair.NewSQL(pool, repair.SQLConfig{Query: r.query})
		if err != nil {
			return fmt.Errorf("projection %q: repair.sql: %w", r.projection, err)
		}
		e.repairers[r.topic] = rep
	}
	return nil
}
