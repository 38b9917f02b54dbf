package bench

import (
	"context"
	"errors"
	"fmt"
	stdlog "log"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
)

// runWatermill is the same per-event transaction as runNaive, written the
// way Watermill users write it: a Kafka subscriber (Sarama, consumer group,
// offsets committed by Watermill after each ack) feeding a router handler.
// Watermill keeps one message in flight per partition and runs each
// handler call in its own goroutine, so the concurrency is one transaction
// per partition, as in the naive consumer.
func runWatermill(ctx context.Context, e *runEnv) error {
	spec := e.spec
	pool, err := openPool(ctx, spec.DatabaseURL, nil, int32(spec.Partitions))
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer pool.Close()
	x, err := newEventTx(ctx, e, pool)
	if err != nil {
		return err
	}
	var logger watermill.LoggerAdapter = watermill.NopLogger{}
	if spec.LogLevel == "debug" {
		logger = watermill.NewStdLoggerWithOut(e.stderr, true, false)
		sarama.Logger = stdlog.New(e.stderr, "sarama: ", stdlog.LstdFlags)
	}
	sc := kafka.DefaultSaramaSubscriberConfig()
	sc.Consumer.Offsets.Initial = sarama.OffsetOldest
	// Watermill's default protocol version (1.0). Sarama with 2.4 or newer
	// fails to join a group on kfake ("error decoding packet: invalid
	// byteslice length"), and the default is what Watermill users run.
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers:               spec.Brokers,
		Unmarshaler:           kafka.DefaultMarshaler{},
		OverwriteSaramaConfig: sc,
		ConsumerGroup:         spec.Identity,
	}, logger)
	if err != nil {
		return fmt.Errorf("watermill subscriber: %w", err)
	}
	defer sub.Close()
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, logger)
	if err != nil {
		return err
	}
	prog := &progress{next: map[int32]int64{}}
	failed := make(chan error, 1)
	// Closing the router does not wait for every handler call in flight,
	// so the handler keeps its own count, and starts no transaction once
	// the run is over.
	var (
		inFlight sync.WaitGroup
		stopping atomic.Bool
	)
	errStopping := errors.New("benchmark over")
	router.AddConsumerHandler("projector-bench", spec.Topic, sub, func(msg *message.Message) error {
		inFlight.Add(1)
		defer inFlight.Done()
		if stopping.Load() {
			return errStopping
		}
		mctx := msg.Context()
		p, ok1 := kafka.MessagePartitionFromCtx(mctx)
		off, ok2 := kafka.MessagePartitionOffsetFromCtx(mctx)
		if !ok1 || !ok2 {
			err := errors.New("watermill message without partition or offset")
			select {
			case failed <- err:
			default:
			}
			return err
		}
		// Not the message's context: a started transaction completes even
		// when the router is closing, so what was counted is what was
		// committed.
		if err := x.apply(context.WithoutCancel(mctx), p, off, msg.Payload); err != nil {
			select {
			case failed <- err:
			default:
			}
			return err
		}
		prog.done(p, off)
		return nil
	})
	if err := e.ready(ctx); err != nil {
		return err
	}
	end := <-e.endOffsets()
	deadline := e.start.Add(spec.TimeLimit)
	ran := make(chan error, 1)
	go func() { ran <- router.Run(ctx) }()

	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	finished := false
	var runErr error
wait:
	for {
		select {
		case <-tick.C:
			if prog.reached(end) {
				finished = true
				break wait
			}
		case <-timer.C:
			break wait
		case err := <-failed:
			runErr = err
			break wait
		case err := <-ran:
			runErr = fmt.Errorf("watermill router stopped: %v", err)
			break wait
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	stopped := time.Now()
	stopping.Store(true)
	if err := router.Close(); err != nil && runErr == nil {
		runErr = err
	}
	inFlight.Wait()
	if runErr != nil {
		return runErr
	}
	res := &WorkerResult{TimedOut: !finished}
	res.Committed, res.Events = prog.snapshot()
	if res.Events == 0 {
		return fmt.Errorf("watermill committed no event in %s (run with --log-level debug to see Sarama's and Watermill's logs)", spec.TimeLimit)
	}
	at := prog.last
	if !finished && at.Before(stopped) {
		at = stopped
	}
	if at.IsZero() {
		at = stopped
	}
	e.finish(res, at)
	e.report(ctx, res)
	return nil
}
