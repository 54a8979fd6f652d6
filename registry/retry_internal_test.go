package registry

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/memory"
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
	v, err := retryTimedOut(t.Context(), nil, 10*time.Millisecond, func(ctx context.Context) (int, error) {
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
	_, err := retryTimedOut(t.Context(), nil, time.Hour, func(context.Context) (int, error) {
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
	_, err := retryTimedOut(t.Context(), nil, 5*time.Millisecond, func(ctx context.Context) (int, error) {
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
	_, err := retryTimedOut(ctx, nil, time.Hour, func(ctx context.Context) (int, error) {
		n.Add(1)
		cancel()
		return hungUntilDone(ctx)
	})
	if !errors.Is(err, context.Canceled) || n.Load() != 1 {
		t.Fatalf("err = %v after %d attempts; want context.Canceled after 1", err, n.Load())
	}
}

// failingOver is a real store that says, as the etcd store does with
// several members, when it leaves a server out (changed) and when it has
// probed its servers (probed); the test decides both.
type failingOver struct {
	store.Store
	changed chan struct{}
	probed  chan struct{}
	asked   chan struct{} // receives each call of Probed
	probes  atomic.Int32
}

func newFailingOver(t *testing.T) *failingOver {
	st := memory.New(memory.Config{})
	t.Cleanup(func() { _ = st.Close() })
	return &failingOver{Store: st, changed: make(chan struct{}), probed: make(chan struct{}), asked: make(chan struct{}, heartbeatAttempts)}
}

func (f *failingOver) ExcludedChanged() <-chan struct{} { return f.changed }

func (f *failingOver) Probed() <-chan struct{} {
	f.probes.Add(1)
	f.asked <- struct{}{}
	return f.probed
}

// TestRetryTimedOutWaitsForTheStoreToProbe: after a timed-out attempt, the
// next waits for the store to probe its servers (so that it does not go
// to the hung one again), and starts once the probe is done.
func TestRetryTimedOutWaitsForTheStoreToProbe(t *testing.T) {
	f := newFailingOver(t)
	go func() {
		<-f.asked
		close(f.probed) // the probe ends
	}()
	var n atomic.Int32
	v, err := retryTimedOut(t.Context(), f, 50*time.Millisecond, func(ctx context.Context) (int, error) {
		if n.Add(1) == 1 {
			return hungUntilDone(ctx)
		}
		select {
		case <-f.probed:
			return 42, nil
		default:
			return 0, errors.New("attempt 2 started before the store's probe ended")
		}
	})
	if err != nil || v != 42 {
		t.Fatalf("retryTimedOut = %d, %v; want 42 from the second attempt", v, err)
	}
}

// TestRetryTimedOutAtOnceWhenTheStoreMovedOn: when the store left a
// server out while the attempt ran (it was in flight on the hung one), the
// next attempt goes at once: no probe is waited for.
func TestRetryTimedOutAtOnceWhenTheStoreMovedOn(t *testing.T) {
	f := newFailingOver(t)
	var n atomic.Int32
	v, err := retryTimedOut(t.Context(), f, 20*time.Millisecond, func(ctx context.Context) (int, error) {
		if n.Add(1) == 1 {
			close(f.changed)
			return hungUntilDone(ctx)
		}
		return 42, nil
	})
	if err != nil || v != 42 || f.probes.Load() != 0 {
		t.Fatalf("retryTimedOut = %d, %v after %d probes; want 42 after none", v, err, f.probes.Load())
	}
}

// TestRetryTimedOutWaitIsBounded: a store that neither moves on nor ends
// its probe holds the next attempt half an attempt's time at most: every
// attempt is made.
func TestRetryTimedOutWaitIsBounded(t *testing.T) {
	f := newFailingOver(t)
	var n atomic.Int32
	_, err := retryTimedOut(t.Context(), f, 20*time.Millisecond, func(ctx context.Context) (int, error) {
		n.Add(1)
		return hungUntilDone(ctx)
	})
	if !errors.Is(err, store.ErrUnavailable) || n.Load() != heartbeatAttempts || f.probes.Load() != heartbeatAttempts-1 {
		t.Fatalf("err = %v after %d attempts and %d probes; want ErrUnavailable after %d and %d", err, n.Load(), f.probes.Load(),
			heartbeatAttempts, heartbeatAttempts-1)
	}
}
