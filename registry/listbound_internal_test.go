package registry

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/memory"
)

// gatedStore is a real store whose listings each wait for a turn the test
// gives, counting how many are in flight at once.
type gatedStore struct {
	store.Store
	turn          chan struct{} // one value lets one listing through
	entered       chan struct{} // a listing began
	inFlight, top atomic.Int64
}

func (g *gatedStore) List(ctx context.Context, prefix string) ([]store.KeyValue, int64, error) {
	n := g.inFlight.Add(1)
	defer g.inFlight.Add(-1)
	for m := g.top.Load(); n > m && !g.top.CompareAndSwap(m, n); m = g.top.Load() {
	}
	g.entered <- struct{}{}
	select {
	case <-g.turn:
	case <-ctx.Done():
		return nil, 0, ctx.Err()
	}
	return g.Store.List(ctx, prefix)
}

// TestFeedListingsAreBounded: watches of three times maxFeedLists
// prefixes opened at once list at most maxFeedLists at a time, and every
// one gets its snapshot as the listings finish.
func TestFeedListingsAreBounded(t *testing.T) {
	mem := memory.New(memory.Config{})
	t.Cleanup(func() { _ = mem.Close() })
	const feeds = 3 * maxFeedLists
	g := &gatedStore{Store: mem, turn: make(chan struct{}), entered: make(chan struct{}, feeds)}
	r, err := New(g, Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	snapshots := make(chan error, feeds)
	for i := range feeds {
		wg.Go(func() {
			w, err := r.Watch(ctx, beacon.Query{Namespace: "bound", Component: fmt.Sprint("c", i)})
			if err == nil {
				var b Batch
				if b, err = w.Next(ctx); err == nil && b.Kind != Snapshot {
					err = fmt.Errorf("first batch %v, want the snapshot", b.Kind)
				}
			}
			snapshots <- err
		})
	}
	began := func(done int) {
		select {
		case <-g.entered:
		case <-ctx.Done():
			t.Fatalf("%d of %d listings done, no other began", done, feeds)
		}
	}
	for range maxFeedLists { // as many in flight as the bound lets: none finished yet
		began(0)
	}
	for done := range feeds { // then one finishes, and another begins
		g.turn <- struct{}{}
		if done+maxFeedLists < feeds {
			began(done + 1)
		}
	}
	wg.Wait()
	close(snapshots)
	for err := range snapshots {
		if err != nil {
			t.Fatal(err)
		}
	}
	if top := g.top.Load(); top != maxFeedLists {
		t.Fatalf("%d listings in flight at once, want at most (and, with %d feeds waiting, exactly) %d", top, feeds, maxFeedLists)
	}
}
