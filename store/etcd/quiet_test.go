package etcd_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/etcdtest"
	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/etcd"
)

// TestQuietWatchFromNextRevisionStaysOpen: the list-then-watch pattern
// (watch from the listing's revision + 1) on a key space nobody writes to
// stays open on a healthy member. etcd answers a progress request only for
// watches that do not start ahead of its revision, so such a watch heard
// nothing and ended as silent after WatchSilenceTimeout: `beacon serve`
// logged "watch stream silent" and DNS and SSE watchers went stale on an
// idle server. The etcd server is this test's own: another test's write
// would advance the revision and hide the fault.
func TestQuietWatchFromNextRevisionStaysOpen(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t, etcdtest.Options{})
	s := newStore(t, srv, etcd.Config{WatchSilenceTimeout: silence})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	first, err := s.Put(ctx, "/quiet/a", []byte("1"))
	if err != nil {
		t.Fatal(err)
	}
	_, rev, err := s.List(ctx, "/quiet/")
	if err != nil {
		t.Fatal(err)
	}
	if rev != first {
		t.Fatalf("listing at revision %d, want the put's %d (a write nobody expected?)", rev, first)
	}
	next := s.Watch(ctx, "/quiet/", rev+1) // the revision after the listing
	at := s.Watch(ctx, "/quiet/", rev)     // the listing's own revision
	// Three silence timeouts: the watch would have ended within 1.25.
	quiet := time.NewTimer(3 * silence)
	defer quiet.Stop()
	select {
	case resp, ok := <-next:
		t.Fatalf("quiet watch from revision %d (the store's is %d) delivered %+v (open %v) on a healthy member", rev+1, rev, resp, ok)
	case <-quiet.C:
	}
	// The watch from the listing's revision delivers that revision's
	// put; the one from the next revision does not (the revision it
	// opened its etcd watch at is not delivered again).
	select {
	case resp := <-at:
		if resp.Err != nil || len(resp.Events) != 1 || resp.Events[0].KV.ModRevision != rev {
			t.Fatalf("watch from %d delivered %+v, want the put at %d", rev, resp, rev)
		}
	default:
		t.Fatalf("watch from %d delivered nothing, want the put at %d", rev, rev)
	}
	second, err := s.Put(ctx, "/quiet/b", []byte("2"))
	if err != nil {
		t.Fatal(err)
	}
	for name, w := range map[string]store.WatchChan{"next": next, "at": at} {
		select {
		case resp := <-w:
			if resp.Err != nil || len(resp.Events) != 1 || resp.Events[0].KV.Key != "/quiet/b" || resp.Events[0].KV.ModRevision != second {
				t.Fatalf("watch %s delivered %+v, want the put of /quiet/b at %d", name, resp, second)
			}
		case <-ctx.Done():
			t.Fatalf("watch %s: no event for the put at %d", name, second)
		}
	}
}

// TestWatchFromCompactionRevision: a watch from exactly the revision the
// store was compacted at still has all it asked for (the revision before,
// where its etcd watch opens so that progress requests are answered, is
// gone) and delivers it; one from an earlier revision is compacted.
func TestWatchFromCompactionRevision(t *testing.T) {
	t.Parallel()
	s := newStore(t, etcdtest.Start(t, etcdtest.Options{}), etcd.Config{}) // compaction is the whole cluster's
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r1, err := s.Put(ctx, "/compactedge/a", []byte("1"))
	if err != nil {
		t.Fatal(err)
	}
	r2, err := s.Put(ctx, "/compactedge/b", []byte("2"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Compact(ctx, r2); err != nil {
		t.Fatal(err)
	}
	select {
	case resp := <-s.Watch(ctx, "/compactedge/", r2):
		if resp.Err != nil || len(resp.Events) != 1 || resp.Events[0].KV.ModRevision != r2 {
			t.Fatalf("watch from the compaction revision %d delivered %+v, want the put at %d", r2, resp, r2)
		}
	case <-ctx.Done():
		t.Fatal("watch from the compaction revision: nothing delivered")
	}
	select {
	case resp := <-s.Watch(ctx, "/compactedge/", r1):
		var ce *store.CompactedError
		if !errors.As(resp.Err, &ce) || ce.Requested != r1 || ce.CompactRevision != r2 {
			t.Fatalf("watch from %d (compacted at %d) delivered %+v, want a CompactedError", r1, r2, resp)
		}
	case <-ctx.Done():
		t.Fatal("watch from a compacted revision: nothing delivered")
	}
}
