package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"github.com/peterbourgon/ff/v3/ffcli"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/projector-dev/projector/internal/kafkaclient"
	"github.com/projector-dev/projector/internal/stopsignal"
	"github.com/projector-dev/projector/outbox"
)

type relayFlags struct {
	common
	dbFlags
	httpAddr        string
	batchSize       int
	shards          int
	pollInterval    time.Duration
	retention       time.Duration
	cleanupInterval time.Duration
	unreadyAfter    time.Duration
	retryBase       time.Duration
	retryCap        time.Duration
}

func relayCommand(_, stderr io.Writer) *ffcli.Command {
	f := &relayFlags{}
	return newCommand("relay", "projector relay [flags]", "Publish the transactional outbox (projector_outbox) to Kafka, in order per aggregate.", stderr,
		f.register,
		func(ctx context.Context, _ []string) error {
			if err := f.validate(); err != nil {
				return err
			}
			log, err := f.logger(stderr)
			if err != nil {
				return err
			}
			defer stopsignal.LogHangup(ctx, log)()
			kcfg, err := f.kafkaConfig(log, nil)
			if err != nil {
				return err
			}
			poolCfg, err := f.dbFlags.poolConfig(f.database())
			if err != nil {
				return err
			}
			cfg := outbox.Config{
				BatchSize:       f.batchSize,
				PollInterval:    f.pollInterval,
				Shards:          f.shards,
				Retention:       f.retention,
				CleanupInterval: f.cleanupInterval,
				UnreadyAfter:    f.unreadyAfter,
				RetryBase:       f.retryBase,
				RetryCap:        f.retryCap,
				Logger:          log,
			}
			if f.registryURL != "" {
				reg, err := f.registryClient()
				if err != nil {
					return err
				}
				cfg.Registry = reg
			} else {
				log.Warn("no --registry-url: events written with a Value (not a Payload) cannot be encoded and wait")
			}
			// /readyz answers while startup waits for PostgreSQL, and
			// says what it waits for.
			ln, err := listen(f.httpAddr)
			if err != nil {
				return err
			}
			metrics := newRegistry()
			cfg.Registerer = metrics
			// franz-go's defaults make the producer idempotent with acks
			// from all in-sync replicas; the relay waits for every batch's
			// acknowledgements, so lingering would only add latency. Its
			// logger makes an unreachable broker heard.
			kcfg.Registerer = metrics
			cl, err := kafkaclient.New(kcfg,
				kgo.RequiredAcks(kgo.AllISRAcks()),
				kgo.ProducerLinger(0),
			)
			if err != nil {
				if ln != nil {
					ln.Close()
				}
				return fmt.Errorf("--brokers: %w", err)
			}
			defer cl.Close()
			cfg.Client = cl

			var (
				relay    atomic.Pointer[outbox.Relay]
				starting starting
			)
			step := starting.step
			step("connecting to PostgreSQL")
			ready := func(ctx context.Context) map[string]error {
				return starting.ready(ctx, func() readiness {
					if r := relay.Load(); r != nil {
						return r
					}
					return nil
				})
			}
			su := newStartup(log, metrics, f.startupTimeout, f.retryBase, f.retryCap, &starting)
			return serveOn(ctx, log, ln, metrics, ready, nil, func(ctx context.Context) error {
				sctx, cancel := su.bound(ctx)
				defer cancel()
				pool, target, err := openDatabase(sctx, poolCfg, su, false)
				if err != nil {
					if ctx.Err() != nil {
						return nil // stopped while starting
					}
					return err
				}
				defer pool.Close()
				if err := su.do(sctx, "connect", func(ctx context.Context) error { return f.dbFlags.checkPooler(ctx, pool, "relay", log) }); err != nil {
					if ctx.Err() != nil {
						return nil
					}
					return err
				}
				step("creating the outbox table if it is missing")
				if err := su.do(sctx, "migrate", func(ctx context.Context) error { return outbox.Migrate(ctx, pool) }); err != nil {
					if ctx.Err() != nil {
						return nil
					}
					return fmt.Errorf("PostgreSQL at %s: %w", target, err)
				}
				r, err := outbox.New(pool, cfg)
				if err != nil {
					return err
				}
				relay.Store(r)
				log.Info("outbox relay running", append(target.attrs(), "shards", f.shards, "batch_size", f.batchSize, "poll_interval", f.pollInterval)...)
				return r.Run(ctx)
			})
		})
}

func (f *relayFlags) register(fs *flag.FlagSet) {
	f.common.register(fs, "brokers", "registry-url", "database-url", "log")
	f.dbFlags.register(fs, "pooler", "startup")
	fs.StringVar(&f.httpAddr, "http-addr", ":8080", "address of /metrics, /livez, /readyz; empty disables")
	fs.IntVar(&f.batchSize, "batch-size", outbox.DefaultBatchSize, "most outbox rows one round claims and publishes; a crash between acknowledgement and marking republishes at most this many")
	fs.IntVar(&f.shards, "shards", outbox.DefaultShards, "aggregate shards the replicas share; every replica must use the same number")
	fs.DurationVar(&f.pollInterval, "poll-interval", outbox.DefaultPollInterval, "how often to look for rows without a notification and to rebalance shards among replicas")
	fs.DurationVar(&f.retention, "retention", outbox.DefaultRetention, "how long published rows are kept before they are deleted; negative keeps them")
	fs.DurationVar(&f.unreadyAfter, "unready-after", outbox.DefaultUnreadyAfter, "records waiting this long for the broker's acknowledgement make /readyz fail and log a warning, until the broker acknowledges again")
	fs.DurationVar(&f.cleanupInterval, "cleanup-interval", outbox.DefaultCleanupInterval, "how often published rows past --retention are deleted and blocked rows retried")
	registerRetry(fs, &f.retryBase, &f.retryCap)
}

func (f *relayFlags) validate() error {
	if f.batchSize < 1 || f.batchSize > 100_000 {
		return fmt.Errorf("--batch-size %d: want 1 to 100000", f.batchSize)
	}
	if f.shards < 1 || f.shards > outbox.MaxShards {
		return fmt.Errorf("--shards %d: want 1 to %d", f.shards, outbox.MaxShards)
	}
	if f.pollInterval <= 0 {
		return fmt.Errorf("--poll-interval %s: must be positive", f.pollInterval)
	}
	if f.retention == 0 {
		return errors.New("--retention 0: use a positive duration, or a negative one to keep published rows")
	}
	if f.cleanupInterval <= 0 {
		return fmt.Errorf("--cleanup-interval %s: must be positive", f.cleanupInterval)
	}
	if f.unreadyAfter <= 0 {
		return fmt.Errorf("--unready-after %s: must be positive", f.unreadyAfter)
	}
	if err := f.dbFlags.validate(); err != nil {
		return err
	}
	if f.pooler == poolerTransaction {
		return errors.New("--database-pooler transaction: " + relayNeedsSession)
	}
	return validateRetry(f.retryBase, f.retryCap)
}
