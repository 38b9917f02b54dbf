package stopsignal

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
)

// Errors a context of Context is cancelled with (context.Cause), by
// signal. Each matches context.Canceled too.
var (
	ErrInterrupt = &stopError{"interrupt received"}
	ErrTerminate = &stopError{"SIGTERM received"}
	ErrHangup    = &stopError{"SIGHUP received"}
)

type stopError struct{ msg string }

func (e *stopError) Error() string { return e.msg }

// Is makes the stop errors match context.Canceled, as the context's Err.
func (e *stopError) Is(target error) bool { return target == context.Canceled }

// Context returns a context that ends, with the signal as its cause, when
// the process receives SIGINT, SIGTERM or SIGHUP. stop releases the
// signals; until it is called, later signals are ignored, so that a
// second SIGHUP during the shutdown does not kill the process.
func Context(parent context.Context) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(parent)
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	done := make(chan struct{})
	go func() {
		defer close(done)
		select {
		case s := <-ch:
			switch s {
			case syscall.SIGHUP:
				cancel(ErrHangup)
			case syscall.SIGTERM:
				cancel(ErrTerminate)
			default:
				cancel(ErrInterrupt)
			}
		case <-ctx.Done():
		}
	}()
	return ctx, func() {
		cancel(context.Canceled)
		<-done
		signal.Stop(ch)
	}
}

// LogHangup logs one line when ctx ends because of SIGHUP, saying that
// the command stops as on SIGTERM. Call the returned function once the
// command no longer needs the line.
func LogHangup(ctx context.Context, log *slog.Logger) (stop func() bool) {
	return context.AfterFunc(ctx, func() {
		if errors.Is(context.Cause(ctx), ErrHangup) {
			log.Warn("SIGHUP received: stopping as for SIGTERM (projector does not reload its configuration; send SIGTERM to stop it, and restart it to apply changes)")
		}
	})
}
