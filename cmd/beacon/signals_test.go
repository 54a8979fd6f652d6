package main

import (
	"context"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestSignalsEscalate: the first SIGINT or SIGTERM ends the command's
// context, the second its urgent context (register's drain and serve's
// graceful shutdown stop waiting), the third exits at once with 130. The
// first two are also tested on real processes
// (TestSecondSignalCutsDrainShort, TestServeSecondSignalCutsShutdownShort).
func TestSignalsEscalate(t *testing.T) {
	exited := make(chan int, 1)
	forceExit = func(code int) { exited <- code }
	t.Cleanup(func() { forceExit = os.Exit })
	var mu sync.Mutex
	var stderr strings.Builder
	ctx, stop := notifySignals(context.Background(), &lockedWriter{mu: &mu, w: &stderr})
	defer stop()
	u := urgent(ctx)
	kill := func(sig syscall.Signal) {
		t.Helper()
		if err := syscall.Kill(os.Getpid(), sig); err != nil {
			t.Fatal(err)
		}
	}
	wait := func(what string, c <-chan struct{}) {
		t.Helper()
		select {
		case <-c:
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: not within 30 s", what)
		}
	}
	if u.Err() != nil || ctx.Err() != nil {
		t.Fatal("done before any signal")
	}
	kill(syscall.SIGINT)
	wait("first signal ends the context", ctx.Done())
	if u.Err() != nil {
		t.Fatal("the first signal ended the urgent context too")
	}
	kill(syscall.SIGTERM)
	wait("second signal ends the urgent context", u.Done())
	kill(syscall.SIGINT)
	select {
	case code := <-exited:
		if code != exitForced {
			t.Fatalf("third signal exits %d, want %d", code, exitForced)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("third signal: no exit within 30 s")
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(stderr.String(), "exiting at once, without cleaning up") {
		t.Fatalf("stderr %q", stderr.String())
	}
	// Without notifySignals the urgent context never ends.
	if urgent(context.Background()).Done() != nil {
		t.Fatal("urgent of a plain context can end")
	}
}
