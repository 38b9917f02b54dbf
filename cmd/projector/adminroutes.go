package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/projector-dev/projector/adminapi"
	"github.com/projector-dev/projector/deadletters"
	"github.com/projector-dev/projector/readapi"
	"github.com/projector-dev/projector/sinks"
	"github.com/projector-dev/projector/sinks/postgres"
)

// withAdmin serves the admin API under /admin/ beside api, on api's port
// with the same authenticator, metrics and access log; pool must be one
// that may write. offsets, when nil, leaves offset resets unserved.
func (a *apiFlags) withAdmin(api *readapi.API, pool *pgxpool.Pool, identity string, offsets adminapi.OffsetResetter, log *slog.Logger) (http.Handler, error) {
	admin, err := adminapi.Handler(adminapi.Config{
		DB: pool, Identity: identity, Authenticator: a.authn, Observer: api,
		Offsets: offsets, Logger: log.With("component", "admin-api"),
	})
	if err != nil {
		return nil, fmt.Errorf("admin API: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/admin/", admin)
	mux.Handle("/", api)
	return mux, nil
}

// offsetResetter resets the stored offsets for the admin API as offsets
// reset does: planned from the brokers' log bounds, moved and audited in
// one transaction, the empty consumer group moved after.
type offsetResetter struct {
	adm     *kadm.Client
	offsets *postgres.Offsets
	group   string
}

func (o offsetResetter) ResetOffsets(ctx context.Context, who deadletters.Actor, r adminapi.Reset) (adminapi.ResetAnswer, error) {
	target := resetTarget{earliest: r.Earliest, latest: r.Latest}
	switch {
	case r.Offset != nil:
		target.offset, target.offsetSet = *r.Offset, true
	case !r.At.IsZero():
		target.at, target.datetime = r.At, r.At.Format("2006-01-02T15:04:05.999999999Z07:00")
	}
	plan, err := planReset(ctx, o.adm, o.offsets, r.Topic, r.Partitions, &target)
	var bad *resetInputError
	if errors.As(err, &bad) {
		return adminapi.ResetAnswer{}, &adminapi.BadResetError{Detail: bad.apiError()}
	}
	if err != nil {
		return adminapi.ResetAnswer{}, err
	}
	ans := adminapi.ResetAnswer{DryRun: r.DryRun}
	if !r.DryRun {
		to := make(map[sinks.TP]int64, len(plan))
		for _, p := range plan {
			to[sinks.TP{Topic: p.Topic, Partition: p.Partition}] = p.NewOffset
		}
		done, err := o.offsets.ResetAs(ctx, who, r.Target()+" (admin API)", to)
		if err != nil {
			return adminapi.ResetAnswer{}, err
		}
		for i := range plan {
			for _, d := range done {
				if d.Topic == plan[i].Topic && d.Partition == plan[i].Partition {
					plan[i].CurrentOffset, plan[i].OwnerEpoch = d.OldOffset, &d.Epoch
				}
			}
		}
		ans.Group = moveEmptyGroup(ctx, o.adm, o.group, plan)
	}
	for _, p := range plan {
		ans.Partitions = append(ans.Partitions, adminapi.ResetLine(p))
	}
	return ans, nil
}
