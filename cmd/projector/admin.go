package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"sort"
	"text/tabwriter"

	"github.com/peterbourgon/ff/v3/ffcli"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/sinks/postgres"
)

func migrateCommand(stdout, stderr io.Writer) *ffcli.Command {
	var (
		c  common
		db dbFlags
	)
	return newCommand("migrate", "projector migrate [flags]", "Create the engine's tables and the projections' tables if missing.", stderr,
		func(fs *flag.FlagSet) {
			c.register(fs, "database-url", "config", "log")
			db.register(fs, "sessions", "startup")
		},
		func(ctx context.Context, _ []string) error {
			if err := db.validate(); err != nil {
				return err
			}
			log, err := c.logger(stderr)
			if err != nil {
				return err
			}
			projs, err := projection.Load(c.config)
			if err != nil {
				return fmt.Errorf("--config: %w", err)
			}
			cfg, err := db.poolConfig(c.databaseURL)
			if err != nil {
				return err
			}
			su := startup{log: log, timeout: db.startupTimeout, base: defaultRetryBase, cap: defaultRetryCap}
			sctx, cancel := su.bound(ctx)
			defer cancel()
			pool, target, err := openDatabase(sctx, cfg, su, false)
			if err != nil {
				return err
			}
			defer pool.Close()
			fmt.Fprintf(stdout, "migrating PostgreSQL at %s\n", target)
			if err := migrate(sctx, su, pool, target, projs); err != nil {
				return err
			}
			fmt.Fprintf(stdout, "migrated: engine tables and %d projection tables\n", len(projs))
			return nil
		})
}

// partitionStatus is one row of `projector status`.
type partitionStatus struct {
	Topic         string `json:"topic"`
	Partition     int32  `json:"partition"`
	NextOffset    *int64 `json:"next_offset"`
	HighWatermark *int64 `json:"high_watermark"`
	Lag           *int64 `json:"lag"`
	OwnerEpoch    int64  `json:"owner_epoch"`
}

func statusCommand(stdout, stderr io.Writer) *ffcli.Command {
	var (
		c      common
		asJSON bool
	)
	return newCommand("status", "projector status [flags]", "Show the stored offset, log-end offset and lag of every partition of an identity.", stderr,
		func(fs *flag.FlagSet) {
			c.register(fs, "brokers", "database-url", "identity")
			fs.BoolVar(&asJSON, "json", false, "print JSON objects instead of a table")
		},
		func(ctx context.Context, _ []string) error {
			pool, err := connect(ctx, c.databaseURL)
			if err != nil {
				return err
			}
			defer pool.Close()
			stored, err := postgres.NewOffsets(pool, c.identity).List(ctx)
			if err != nil {
				return err
			}
			ends := map[string]map[int32]int64{}
			if len(stored) > 0 {
				brokers, err := c.brokerList()
				if err != nil {
					return err
				}
				cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
				if err != nil {
					return fmt.Errorf("--brokers: %w", err)
				}
				defer cl.Close()
				topics := map[string]bool{}
				for _, s := range stored {
					topics[s.Topic] = true
				}
				names := make([]string, 0, len(topics))
				for t := range topics {
					names = append(names, t)
				}
				sort.Strings(names)
				listed, err := kadm.NewClient(cl).ListEndOffsets(ctx, names...)
				if err != nil {
					return fmt.Errorf("list log-end offsets: %w", err)
				}
				listed.Each(func(o kadm.ListedOffset) {
					if o.Err == nil {
						if ends[o.Topic] == nil {
							ends[o.Topic] = map[int32]int64{}
						}
						ends[o.Topic][o.Partition] = o.Offset
					}
				})
			}
			rows := make([]partitionStatus, 0, len(stored))
			for _, s := range stored {
				r := partitionStatus{Topic: s.Topic, Partition: s.Partition, NextOffset: s.NextOffset, OwnerEpoch: s.Epoch}
				if end, ok := ends[s.Topic][s.Partition]; ok {
					r.HighWatermark = &end
					if s.NextOffset != nil {
						lag := max(0, end-*s.NextOffset)
						r.Lag = &lag
					}
				}
				rows = append(rows, r)
			}
			if asJSON {
				enc := json.NewEncoder(stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(rows)
			}
			tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "TOPIC\tPARTITION\tCURRENT-OFFSET\tLOG-END-OFFSET\tLAG\tOWNER-EPOCH")
			for _, r := range rows {
				fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%d\n", r.Topic, r.Partition, orDash(r.NextOffset), orDash(r.HighWatermark), orDash(r.Lag), r.OwnerEpoch)
			}
			return tw.Flush()
		})
}

func orDash(p *int64) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprint(*p)
}
