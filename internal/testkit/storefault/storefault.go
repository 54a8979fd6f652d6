// Package storefault wraps a real store so that a test can make it look
// unreachable to a prober while the watches already open go on: reads
// (Get) wait for the test and fail, as they do on a store too busy to
// answer in time or cut off from its server, and progress notifications
// stop until a read is answered again; and end its watches as silent, as
// an etcd watch ends when its member hangs. Everything else reaches the
// store.
package storefault

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/beaconplane/beacon/store"
)

// Store is a store whose reads a test can hold and fail. It promises
// progress notifications every Interval (0: no promise): through the
// wrapped store's WatchProgress when it has one, else through plain
// watches (a promise broken, for tests of what a broken one costs).
type Store struct {
	store.Store
	progress store.ProgressWatcher
	interval time.Duration
	down     atomic.Bool
	answered atomic.Bool // a Get was answered since GoDown
	pinged   chan struct{}
	release  chan struct{}
	free     chan struct{} // closed by Free
	freeOnce sync.Once

	mu      sync.Mutex
	silence chan struct{} // closed by Silence, then replaced
}

// New wraps st, promising progress every interval.
func New(st store.Store, interval time.Duration) *Store {
	s := &Store{Store: st, interval: interval, pinged: make(chan struct{}), release: make(chan struct{}), free: make(chan struct{}),
		silence: make(chan struct{})}
	s.progress, _ = st.(store.ProgressWatcher)
	return s
}

// GoDown makes every Get wait: it is announced on Pinged and fails with
// store.ErrUnavailable once the test calls Release. Progress
// notifications are dropped from now until a Get is answered after
// ComeBack (a store answers reads before its watches report progress).
func (s *Store) GoDown() {
	s.answered.Store(false)
	s.down.Store(true)
}

// ComeBack ends GoDown: Gets reach the store again.
func (s *Store) ComeBack() { s.down.Store(false) }

// Pinged receives once per Get made while down; the Get waits for Release
// (or Free).
func (s *Store) Pinged() <-chan struct{} { return s.pinged }

// Release fails the Get announced on Pinged.
func (s *Store) Release() { s.release <- struct{}{} }

// Free ends every wait for good: Gets held now or later fail at once.
// Register it with t.Cleanup after whatever reads through the store, so
// that it runs first: a test that failed between Pinged and Release
// would otherwise leave that reader's Close waiting.
func (s *Store) Free() { s.freeOnce.Do(func() { close(s.free) }) }

// Get reads from the store, or, while down, waits for Release and fails.
func (s *Store) Get(ctx context.Context, key string) (store.KeyValue, error) {
	if !s.down.Load() {
		kv, err := s.Store.Get(ctx, key)
		s.answered.Store(true)
		return kv, err
	}
	select {
	case s.pinged <- struct{}{}:
		select {
		case <-s.release: // once announced, the test decides when it fails, whatever ctx says
		case <-s.free:
		}
	case <-s.free:
	}
	return store.KeyValue{}, fmt.Errorf("storefault: get %q: %w", key, store.ErrUnavailable)
}

// ProgressInterval implements store.ProgressWatcher: the promise New was
// given.
func (s *Store) ProgressInterval() time.Duration { return s.interval }

// Silence ends every watch open now with an error matching
// store.ErrWatchSilent, as an etcd watch ends when its member hangs.
func (s *Store) Silence() {
	s.mu.Lock()
	defer s.mu.Unlock()
	close(s.silence)
	s.silence = make(chan struct{})
}

// Watch is the store's watch, which Silence can end.
func (s *Store) Watch(ctx context.Context, prefix string, from int64) store.WatchChan {
	return s.forward(ctx, func(ctx context.Context) store.WatchChan { return s.Store.Watch(ctx, prefix, from) })
}

// WatchProgress implements store.ProgressWatcher, dropping progress
// notifications while the store looks unreachable; Silence can end it.
func (s *Store) WatchProgress(ctx context.Context, prefix string, from int64) store.WatchChan {
	if s.progress == nil {
		return s.Watch(ctx, prefix, from)
	}
	return s.forward(ctx, func(ctx context.Context) store.WatchChan { return s.progress.WatchProgress(ctx, prefix, from) })
}

// forward relays the responses of the watch open makes, leaving out
// progress while the store looks unreachable, until the watch ends or
// Silence ends it.
func (s *Store) forward(ctx context.Context, open func(context.Context) store.WatchChan) store.WatchChan {
	s.mu.Lock()
	silence := s.silence
	s.mu.Unlock()
	wctx, cancel := context.WithCancel(ctx)
	in := open(wctx)
	out := make(chan store.WatchResponse)
	go func() {
		defer close(out)
		defer func() {
			cancel()
			for range in { // the inner watch closes once cancelled
			}
		}()
		for {
			select {
			case resp, ok := <-in:
				if !ok {
					return
				}
				if resp.Progress != 0 && (s.down.Load() || !s.answered.Load()) {
					continue
				}
				select {
				case out <- resp:
				case <-ctx.Done():
					return
				}
			case <-silence:
				select {
				case out <- store.WatchResponse{Err: fmt.Errorf("storefault: %w", store.ErrWatchSilent)}:
				case <-ctx.Done():
				}
				return
			}
		}
	}()
	return out
}
