package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/peterbourgon/ff/v3/ffcli"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/projector-dev/projector/internal/kafkaclient"
	"github.com/projector-dev/projector/outbox"
)

type relayFlags struct {
	common
	httpAddr        string
	batchSize       int
	shards          int
	pollInterval    time.Duration
	retention       time.Duration
	cleanupInterval time.Duration
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
			brokers, err := f.brokerList()
			if err != nil {
				return err
			}
			log, err := f.logger(stderr)
			if err != nil {
				return err
			}
			pool, err := connect(ctx, f.databaseURL)
			if err != nil {
				return err
			}
			defer pool.Close()
			if err := outbox.Migrate(ctx, pool); err != nil {
				return err
			}
			metrics := newRegistry()
			// franz-go's defaults make the producer idempotent with acks
			// from all in-sync replicas; the relay waits for every batch's
			// acknowledgements, so lingering would only add latency.
			cl, err := kafkaclient.New(kafkaclient.Config{Brokers: brokers, Registerer: metrics},
				kgo.RequiredAcks(kgo.AllISRAcks()),
				kgo.ProducerLinger(0),
			)
			if err != nil {
				return fmt.Errorf("--brokers: %w", err)
			}
			defer cl.Close()
			cfg := outbox.Config{
				Client:          cl,
				BatchSize:       f.batchSize,
				PollInterval:    f.pollInterval,
				Shards:          f.shards,
				Retention:       f.retention,
				CleanupInterval: f.cleanupInterval,
				RetryBase:       f.retryBase,
				RetryCap:        f.retryCap,
				Logger:          log,
				Registerer:      metrics,
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
			r, err := outbox.New(pool, cfg)
			if err != nil {
				return err
			}
			log.Info("outbox relay running", "shards", f.shards, "batch_size", f.batchSize, "poll_interval", f.pollInterval)

			return serve(ctx, log, f.httpAddr, metrics, r.Ready, nil, r.Run)
		})
}

func (f *relayFlags) register(fs *flag.FlagSet) {
	f.common.register(fs, "brokers", "registry-url", "database-url", "log")
	fs.StringVar(&f.httpAddr, "http-addr", ":8080", "address of /metrics, /livez, /readyz (PROJECTOR_HTTP_ADDR); empty disables")
	fs.IntVar(&f.batchSize, "batch-size", outbox.DefaultBatchSize, "most outbox rows one round claims and publishes; a crash between acknowledgement and marking republishes at most this many (PROJECTOR_BATCH_SIZE)")
	fs.IntVar(&f.shards, "shards", outbox.DefaultShards, "aggregate shards the replicas share; every replica must use the same number (PROJECTOR_SHARDS)")
	fs.DurationVar(&f.pollInterval, "poll-interval", outbox.DefaultPollInterval, "how often to look for rows without a notification and to rebalance shards among replicas (PROJECTOR_POLL_INTERVAL)")
	fs.DurationVar(&f.retention, "retention", outbox.DefaultRetention, "how long published rows are kept before they are deleted; negative keeps them (PROJECTOR_RETENTION)")
	fs.DurationVar(&f.cleanupInterval, "cleanup-interval", outbox.DefaultCleanupInterval, "how often published rows past --retention are deleted and blocked rows retried (PROJECTOR_CLEANUP_INTERVAL)")
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
	return validateRetry(f.retryBase, f.retryCap)
}
