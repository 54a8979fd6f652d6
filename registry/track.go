package registry

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/wait"
)

// trackMaxBackoff caps the delay before Track opens a watch again.
const trackMaxBackoff = 5 * time.Second

// Track keeps a watch of q open for as long as ctx lives and calls apply
// with every batch, in order, from one goroutine (the caller's). A watch
// that ends with an error other than the end of ctx (a registry that could
// not open one, say) is reported to apply as a Stale batch, and a new one is
// opened after a capped, jittered backoff; its first batch is a Snapshot,
// which replaces what apply built. This is how a consumer that serves a
// view of the registry for the life of a process (DNS, xDS) follows it.
//
// Track returns nil once ctx is done, and an error matching ErrClosed
// when the registry was closed (no watch will open again).
func Track(ctx context.Context, d Discoverer, q beacon.Query, apply func(Batch)) error {
	bo := newBackoff(trackMaxBackoff)
	for {
		err := trackOnce(ctx, d, q, apply, bo)
		if ctx.Err() != nil {
			return nil
		}
		apply(Batch{Kind: Stale, Err: err})
		if errors.Is(err, ErrClosed) {
			return err
		}
		if !wait.Sleep(ctx, bo.next()) {
			return nil
		}
	}
}

// trackOnce runs one watch until it ends; the backoff starts over once it
// delivered a batch.
func trackOnce(ctx context.Context, d Discoverer, q beacon.Query, apply func(Batch), bo *backoff) error {
	w, err := d.Watch(ctx, q)
	if err != nil {
		return fmt.Errorf("watch %s: %w", q, err)
	}
	defer func() { _ = w.Close() }()
	for {
		b, err := w.Next(ctx)
		if err != nil {
			return err
		}
		bo.reset()
		apply(b)
	}
}
