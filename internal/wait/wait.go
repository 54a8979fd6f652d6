// Package wait holds the two waits every long-lived loop of Beacon makes:
// a pause that ends early when its context does (Sleep), and a periodic
// task that stops with its context (Every).
package wait

import (
	"context"
	"time"
)

// Sleep waits for d or until ctx is done, and reports whether d elapsed
// (false: ctx is done). A d of zero or less does not wait.
func Sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// Every calls fn every d, the first time d after it is called, until ctx
// is done; it returns then. fn runs in the caller's goroutine: a call that
// takes longer than d delays the next (ticks do not pile up).
func Every(ctx context.Context, d time.Duration, fn func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if ctx.Err() != nil {
			return // both were ready: the context wins
		}
		fn()
	}
}
