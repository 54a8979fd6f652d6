package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// urgentKey carries, in a command's context, the context that the second
// signal ends.
type urgentKey struct{}

// exitForced is the exit status after a third signal (128 + SIGINT, as a
// shell reports a process ended by Ctrl-C).
const exitForced = 130

// forceExit ends the process after a third signal (a variable for tests).
var forceExit = os.Exit

// notifySignals returns a context that SIGINT or SIGTERM ends. Commands
// that go on working after it ends (register's --drain, serve's graceful
// shutdown) watch urgent(ctx), which the second signal ends, to cut that
// work short; a third signal exits at once, without cleaning up. stop
// stops listening and waits for the goroutine it started.
func notifySignals(parent context.Context, stderr io.Writer) (ctx context.Context, stop func()) {
	u, cutShort := context.WithCancel(context.WithoutCancel(parent))
	ctx, cancel := context.WithCancel(context.WithValue(parent, urgentKey{}, u))
	sigs := make(chan os.Signal, 3)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for n := 1; ; n++ {
			select {
			case <-quit:
				return
			case sig := <-sigs:
				switch n {
				case 1:
					cancel()
				case 2:
					cutShort()
				default:
					fmt.Fprintf(stderr, "beacon: %v again: exiting at once, without cleaning up\n", sig)
					forceExit(exitForced)
				}
			}
		}
	}()
	var once sync.Once
	return ctx, func() {
		once.Do(func() {
			signal.Stop(sigs)
			close(quit)
			wg.Wait()
			cancel()
			cutShort()
		})
	}
}

// urgent returns the context that ends when a command must cut short the
// work it does after its context ended: at the second signal. It keeps
// ctx's values; without notifySignals (tests, embedders) it never ends.
func urgent(ctx context.Context) context.Context {
	if u, ok := ctx.Value(urgentKey{}).(context.Context); ok {
		return u
	}
	return context.WithoutCancel(ctx)
}
