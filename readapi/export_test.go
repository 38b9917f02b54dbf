package readapi

import (
	"context"

	"github.com/projector-dev/projector/projection"
)

// TenantReads are the statements of a tenant-bound read by key of p,
// alone and batched, as the API builds them from p's table.
func TenantReads(ctx context.Context, db Querier, p *projection.Projection) (one, batched string, err error) {
	t, err := (&view{p: p}).columns(ctx, db)
	if err != nil {
		return "", "", err
	}
	return t.getTenant, t.getManyTenant, nil
}
