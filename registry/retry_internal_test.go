package registry

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/beaconplane/beacon/store"
)

// hungUntilDone answers nothing until its context ends, as a call to a
// hung etcd member does, and then fails as the etcd store does.
func hungUntilDone(ctx context.Context) (int, error) {
	<-ctx.Done()
	return 0, fmt.Errorf("%w: no answer: %w", store.ErrUnavailable, ctx.Err())
}

// TestRetryTimedOutNextAttemptAfterATimeout: an attempt that ran out of
// its time is followed by another, whose answer is returned.
func TestRetryTimedOutNextAttemptAfterATimeout(t *testing.T) {
	var n atomic.Int32
	v, err := retryTimedOut(t.Context(), 10*time.Millisecond, func(ctx context.Context) (int, error) {
		if n.Add(1) == 1 {
			return hungUntilDone(ctx)
		}
		return 42, nil
	})
	if err != nil || v != 42 || n.Load() != 2 {
		t.Fatalf("retryTimedOut = %d, %v after %d attempts; want 42 from the second", v, err, n.Load())
	}
}

// TestRetryTimedOutFastFailureIsAnAnswer: an attempt that fails before its
// deadline (a refusal, a lease not found) is returned at once, untried.
func TestRetryTimedOutFastFailureIsAnAnswer(t *testing.T) {
	var n atomic.Int32
	_, err := retryTimedOut(t.Context(), time.Hour, func(context.Context) (int, error) {
		n.Add(1)
		return 0, store.ErrLeaseNotFound
	})
	if !errors.Is(err, store.ErrLeaseNotFound) || n.Load() != 1 {
		t.Fatalf("err = %v after %d attempts; want ErrLeaseNotFound after 1", err, n.Load())
	}
}

// TestRetryTimedOutGivesUpAfterAttempts: when every attempt runs out of
// its time, it stops after heartbeatAttempts and returns the timeout.
func TestRetryTimedOutGivesUpAfterAttempts(t *testing.T) {
	var n atomic.Int32
	_, err := retryTimedOut(t.Context(), 5*time.Millisecond, func(ctx context.Context) (int, error) {
		n.Add(1)
		return hungUntilDone(ctx)
	})
	if !errors.Is(err, store.ErrUnavailable) || n.Load() != heartbeatAttempts {
		t.Fatalf("err = %v after %d attempts; want ErrUnavailable after %d", err, n.Load(), heartbeatAttempts)
	}
}

// TestRetryTimedOutCallerCancelledStops: the caller's context ending ends
// the attempt and starts no new one.
func TestRetryTimedOutCallerCancelledStops(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	var n atomic.Int32
	_, err := retryTimedOut(ctx, time.Hour, func(ctx context.Context) (int, error) {
		n.Add(1)
		cancel()
		return hungUntilDone(ctx)
	})
	if !errors.Is(err, context.Canceled) || n.Load() != 1 {
		t.Fatalf("err = %v after %d attempts; want context.Canceled after 1", err, n.Load())
	}
}
