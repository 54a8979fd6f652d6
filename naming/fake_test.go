package naming_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry"
)

// The unit tests drive the resolver with scripted watch batches, to check
// its handling of every batch kind and failure; the end-to-end tests
// (grpc_test.go, etcd_test.go) use the real registry.

// fakeDiscoverer hands out scripted watchers: each Watch call takes the
// next result from watches.
type fakeDiscoverer struct {
	watches chan watchResult
	mu      sync.Mutex
	queries []beacon.Query
}

type watchResult struct {
	w   *fakeWatcher
	err error
}

func newFakeDiscoverer() *fakeDiscoverer {
	return &fakeDiscoverer{watches: make(chan watchResult, 16)}
}

// next scripts the result of the next Watch call and returns the watcher.
func (d *fakeDiscoverer) next() *fakeWatcher {
	w := &fakeWatcher{batches: make(chan batchOrErr, 16), closed: make(chan struct{})}
	d.watches <- watchResult{w: w}
	return w
}

func (d *fakeDiscoverer) fail(err error) { d.watches <- watchResult{err: err} }

func (d *fakeDiscoverer) List(context.Context, beacon.Query) ([]beacon.Instance, int64, error) {
	panic("the resolver does not list")
}

// Watch takes the next scripted result, waiting for one like a real
// registry would wait for its store (but Watch itself must not block in a
// real Discoverer; the resolver calls it from its own goroutine anyway).
func (d *fakeDiscoverer) Watch(ctx context.Context, q beacon.Query, _ ...registry.WatchOption) (registry.Watcher, error) {
	d.mu.Lock()
	d.queries = append(d.queries, q)
	d.mu.Unlock()
	select {
	case r := <-d.watches:
		if r.err != nil {
			return nil, r.err
		}
		return r.w, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

type batchOrErr struct {
	b   registry.Batch
	err error
}

type fakeWatcher struct {
	batches   chan batchOrErr
	closed    chan struct{}
	closeOnce sync.Once
}

func (w *fakeWatcher) send(kind registry.BatchKind, events ...beacon.Event) {
	w.batches <- batchOrErr{b: registry.Batch{Kind: kind, Events: events}}
}

func (w *fakeWatcher) stale(err error) {
	w.batches <- batchOrErr{b: registry.Batch{Kind: registry.Stale, Err: err}}
}

func (w *fakeWatcher) end(err error) { w.batches <- batchOrErr{err: err} }

func (w *fakeWatcher) Next(ctx context.Context) (registry.Batch, error) {
	select {
	case b := <-w.batches:
		return b.b, b.err
	case <-ctx.Done():
		return registry.Batch{}, ctx.Err()
	case <-w.closed:
		return registry.Batch{}, registry.ErrWatchClosed
	}
}

func (w *fakeWatcher) Instances() []beacon.Instance { return nil }

func (w *fakeWatcher) Close() error {
	w.closeOnce.Do(func() { close(w.closed) })
	return nil
}

// waitClosed fails the test unless the resolver closes w.
func (w *fakeWatcher) waitClosed(tb testing.TB) {
	tb.Helper()
	select {
	case <-w.closed:
	case <-time.After(10 * time.Second):
		tb.Fatal("the resolver did not close its watcher")
	}
}

func inst(id, addr string, md map[string]string) beacon.Instance {
	return beacon.Instance{
		Namespace: "prod", Component: "api", Endpoint: "grpc",
		ID: id, Address: addr, Metadata: md, Status: beacon.StatusServing,
		RegisteredAt: time.Unix(1700000000, 0).UTC(),
	}
}

func added(in beacon.Instance) beacon.Event { return beacon.Event{Type: beacon.Added, Instance: in} }
func updated(in beacon.Instance) beacon.Event {
	return beacon.Event{Type: beacon.Updated, Instance: in}
}
func removed(in beacon.Instance) beacon.Event {
	return beacon.Event{Type: beacon.Removed, Instance: in}
}

func draining(in beacon.Instance) beacon.Instance {
	in.Status = beacon.StatusDraining
	return in
}
