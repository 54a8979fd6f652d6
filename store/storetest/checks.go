package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/beaconplane/beacon/store"
	"go.uber.org/goleak"
)

func testGetNotFound(t *testing.T, h *harness) {
	s, ctx := h.store(t), h.ctx(t)
	_, err := s.Get(ctx, h.key("missing"))
	wantErr(t, "Get of an absent key", err, store.ErrNotFound)
}

func testCreateIfAbsent(t *testing.T, h *harness) {
	s, ctx := h.store(t), h.ctx(t)
	k := h.key("k")
	rev, err := s.Create(ctx, k, []byte("first"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Create(ctx, k, []byte("second"))
	wantErr(t, "second Create", err, store.ErrKeyExists)
	kv := mustGet(t, ctx, s, k)
	if string(kv.Value) != "first" || kv.CreateRevision != rev || kv.ModRevision != rev {
		t.Fatalf("after a refused Create: %q create=%d mod=%d, want %q at %d", kv.Value, kv.CreateRevision, kv.ModRevision, "first", rev)
	}
	// Create works again once the key is deleted.
	if _, err := s.Delete(ctx, k); err != nil {
		t.Fatal(err)
	}
	rev2, err := s.Create(ctx, k, []byte("third"))
	if err != nil {
		t.Fatalf("Create after Delete: %v", err)
	}
	if kv := mustGet(t, ctx, s, k); kv.CreateRevision != rev2 {
		t.Fatalf("re-created key has CreateRevision %d, want %d", kv.CreateRevision, rev2)
	}
}

func testPutKeepsCreateRevision(t *testing.T, h *harness) {
	s, ctx := h.store(t), h.ctx(t)
	k := h.key("k")
	r1 := mustPut(t, ctx, s, k, "a")
	r2 := mustPut(t, ctx, s, k, "b")
	if r2 <= r1 {
		t.Fatalf("second Put revision %d not after first %d", r2, r1)
	}
	kv := mustGet(t, ctx, s, k)
	if string(kv.Value) != "b" || kv.CreateRevision != r1 || kv.ModRevision != r2 {
		t.Fatalf("got %q create=%d mod=%d, want %q create=%d mod=%d", kv.Value, kv.CreateRevision, kv.ModRevision, "b", r1, r2)
	}
	// An empty value is a value.
	mustPut(t, ctx, s, h.key("empty"), "")
	if kv := mustGet(t, ctx, s, h.key("empty")); len(kv.Value) != 0 {
		t.Fatalf("empty value read back as %q", kv.Value)
	}
}

func testUpdateCAS(t *testing.T, h *harness) {
	s, ctx := h.store(t), h.ctx(t)
	k := h.key("k")
	r1 := mustPut(t, ctx, s, k, "v1")
	r2, err := s.Update(ctx, k, []byte("v2"), r1)
	if err != nil {
		t.Fatalf("Update at the current revision: %v", err)
	}
	_, err = s.Update(ctx, k, []byte("stale"), r1)
	wantErr(t, "Update at a stale revision", err, store.ErrConflict)
	if kv := mustGet(t, ctx, s, k); string(kv.Value) != "v2" || kv.ModRevision != r2 {
		t.Fatalf("a refused Update changed the key: %q at %d", kv.Value, kv.ModRevision)
	}
	_, err = s.Update(ctx, h.key("absent"), []byte("x"), r1)
	wantErr(t, "Update of an absent key", err, store.ErrNotFound)
	if _, err := s.Get(ctx, h.key("absent")); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a refused Update created the key: %v", err)
	}
}

func testDeletePlain(t *testing.T, h *harness) {
	s, ctx := h.store(t), h.ctx(t)
	k := h.key("k")
	r1 := mustPut(t, ctx, s, k, "v")
	rd, err := s.Delete(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	if rd <= r1 {
		t.Fatalf("Delete revision %d not after Put %d", rd, r1)
	}
	_, err = s.Get(ctx, k)
	wantErr(t, "Get after Delete", err, store.ErrNotFound)
	_, err = s.Delete(ctx, k)
	wantErr(t, "Delete of an absent key", err, store.ErrNotFound)
}

func testDeleteIfModRevision(t *testing.T, h *harness) {
	s, ctx := h.store(t), h.ctx(t)
	k := h.key("k")
	r1 := mustPut(t, ctx, s, k, "v1")
	mustPut(t, ctx, s, k, "v2")
	_, err := s.Delete(ctx, k, store.IfModRevision(r1))
	wantErr(t, "Delete at a stale revision", err, store.ErrConflict)
	kv := mustGet(t, ctx, s, k)
	if _, err := s.Delete(ctx, k, store.IfModRevision(kv.ModRevision)); err != nil {
		t.Fatalf("Delete at the current revision: %v", err)
	}
	_, err = s.Delete(ctx, k, store.IfModRevision(kv.ModRevision))
	wantErr(t, "conditional Delete of an absent key", err, store.ErrNotFound)
}

func testRevisionsMonotonic(t *testing.T, h *harness) {
	s, ctx := h.store(t), h.ctx(t)
	_, start, err := s.List(ctx, h.prefix)
	if err != nil {
		t.Fatal(err)
	}
	last := start
	for i := range 20 {
		rev := mustPut(t, ctx, s, h.key(fmt.Sprint(i%3)), "v")
		if rev <= last {
			t.Fatalf("write %d got revision %d, not after %d", i, rev, last)
		}
		last = rev
	}
	_, now, err := s.List(ctx, h.prefix)
	if err != nil {
		t.Fatal(err)
	}
	if now < last {
		t.Fatalf("List revision %d is before the last write %d", now, last)
	}
}

func testListSnapshotRevision(t *testing.T, h *harness) {
	s, ctx := h.store(t), h.ctx(t)
	want := map[string]string{}
	var last int64
	for i := range 10 {
		k := h.key(fmt.Sprintf("k%02d", i))
		want[k] = fmt.Sprint("v", i)
		last = mustPut(t, ctx, s, k, want[k])
	}
	kvs, rev, err := s.List(ctx, h.prefix)
	if err != nil {
		t.Fatal(err)
	}
	if rev < last {
		t.Fatalf("List revision %d is before the last write %d", rev, last)
	}
	if len(kvs) != len(want) {
		t.Fatalf("List returned %d keys, want %d", len(kvs), len(want))
	}
	if !slices.IsSortedFunc(kvs, func(a, b store.KeyValue) int { return strings.Compare(a.Key, b.Key) }) {
		t.Fatal("List result is not sorted by key")
	}
	for _, kv := range kvs {
		if want[kv.Key] != string(kv.Value) || kv.ModRevision > rev || kv.CreateRevision == 0 {
			t.Fatalf("List returned %q=%q mod=%d create=%d (snapshot %d)", kv.Key, kv.Value, kv.ModRevision, kv.CreateRevision, rev)
		}
	}
	empty, _, err := s.List(ctx, h.key("nothing-here/"))
	if err != nil || len(empty) != 0 {
		t.Fatalf("List of an empty prefix: %v, %v", empty, err)
	}
}

func testListPrefixIsolation(t *testing.T, h *harness) {
	s, ctx := h.store(t), h.ctx(t)
	mustPut(t, ctx, s, h.key("a/b/x"), "1")
	mustPut(t, ctx, s, h.key("a/bc/x"), "2")
	mustPut(t, ctx, s, h.key("a/b"), "3")
	kvs, _, err := s.List(ctx, h.key("a/b/"))
	if err != nil {
		t.Fatal(err)
	}
	if len(kvs) != 1 || kvs[0].Key != h.key("a/b/x") {
		t.Fatalf("List(%q) = %v, want only %q", h.key("a/b/"), keys(kvs), h.key("a/b/x"))
	}
	// Without the slash the prefix is a byte prefix and matches all three.
	kvs, _, err = s.List(ctx, h.key("a/b"))
	if err != nil || len(kvs) != 3 {
		t.Fatalf("List(%q) = %v, %v; want 3 keys", h.key("a/b"), keys(kvs), err)
	}
}

func keys(kvs []store.KeyValue) []string {
	var out []string
	for _, kv := range kvs {
		out = append(out, kv.Key)
	}
	return out
}

func testLeaseExpiry(t *testing.T, h *harness) {
	s, ctx := h.store(t), h.ctx(t)
	l, err := s.Grant(ctx, h.opts.LeaseTTL)
	if err != nil {
		t.Fatal(err)
	}
	if l.TTL < h.opts.LeaseTTL {
		t.Fatalf("granted TTL %v is shorter than the %v asked", l.TTL, h.opts.LeaseTTL)
	}
	_, rev, err := s.List(ctx, h.prefix)
	if err != nil {
		t.Fatal(err)
	}
	w := s.Watch(ctx, h.prefix, rev+1)
	names := []string{"a", "b", "c"}
	for _, n := range names {
		mustPut(t, ctx, s, h.key(n), n, store.WithLease(l.ID))
	}
	mustPut(t, ctx, s, h.key("unleased"), "stays")
	h.events(t, w, 4)
	granted := time.Now()

	// All three deletions arrive together, at one revision.
	deadline := time.After(l.TTL + h.opts.ExpiryGrace + h.opts.Timeout)
	var dels []store.Event
	for len(dels) < len(names) {
		select {
		case resp, ok := <-w:
			if !ok || resp.Err != nil {
				t.Fatalf("watch ended while waiting for expiry: %v", resp.Err)
			}
			if len(dels) > 0 && len(resp.Events) > 0 {
				t.Fatalf("expiry deletions split over responses: %v then %v", describe(dels), describe(resp.Events))
			}
			dels = append(dels, resp.Events...)
		case <-deadline:
			t.Fatalf("lease of TTL %v not expired after %v", l.TTL, time.Since(granted))
		}
	}
	if took := time.Since(granted); took < l.TTL/2 {
		t.Fatalf("lease of TTL %v expired after only %v", l.TTL, took)
	}
	for _, d := range dels {
		if d.Type != store.EventDelete || d.Revision() != dels[0].Revision() {
			t.Fatalf("expiry events %v are not deletions at one revision", describe(dels))
		}
	}
	kvs, _, err := s.List(ctx, h.prefix)
	if err != nil {
		t.Fatal(err)
	}
	if len(kvs) != 1 || kvs[0].Key != h.key("unleased") {
		t.Fatalf("after expiry the prefix holds %v, want only the unleased key", keys(kvs))
	}
	_, err = s.KeepAlive(ctx, l.ID)
	wantErr(t, "KeepAlive of an expired lease", err, store.ErrLeaseNotFound)
}

func testLeaseRevoke(t *testing.T, h *harness) {
	s, ctx := h.store(t), h.ctx(t)
	l, err := s.Grant(ctx, 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_, rev, err := s.List(ctx, h.prefix)
	if err != nil {
		t.Fatal(err)
	}
	w := s.Watch(ctx, h.prefix, rev+1)
	mustPut(t, ctx, s, h.key("a"), "1", store.WithLease(l.ID))
	mustPut(t, ctx, s, h.key("b"), "2", store.WithLease(l.ID))
	h.events(t, w, 2)
	if err := s.Revoke(ctx, l.ID); err != nil {
		t.Fatal(err)
	}
	dels := h.events(t, w, 2)
	if dels[0].Type != store.EventDelete || dels[1].Type != store.EventDelete || dels[0].Revision() != dels[1].Revision() {
		t.Fatalf("revoke events %v are not deletions at one revision", describe(dels))
	}
	kvs, _, err := s.List(ctx, h.prefix)
	if err != nil || len(kvs) != 0 {
		t.Fatalf("after Revoke: %v, %v", keys(kvs), err)
	}
	wantErr(t, "second Revoke", s.Revoke(ctx, l.ID), store.ErrLeaseNotFound)
}

func testKeepAliveExtends(t *testing.T, h *harness) {
	s, ctx := h.store(t), h.ctx(t)
	l, err := s.Grant(ctx, h.opts.LeaseTTL)
	if err != nil {
		t.Fatal(err)
	}
	k := h.key("k")
	mustPut(t, ctx, s, k, "v", store.WithLease(l.ID))
	// Keep the lease alive at a third of its TTL for twice its TTL (plus
	// the expiry grace): the key must outlive its original deadline.
	hold := 2*l.TTL + h.opts.ExpiryGrace
	tick := time.NewTicker(l.TTL / 3)
	end := time.After(hold)
	for done := false; !done; {
		select {
		case <-tick.C:
			ttl, err := s.KeepAlive(ctx, l.ID)
			if err != nil {
				t.Fatalf("KeepAlive: %v", err)
			}
			if ttl < h.opts.LeaseTTL {
				t.Fatalf("KeepAlive returned TTL %v, below the %v asked", ttl, h.opts.LeaseTTL)
			}
		case <-end:
			done = true
		}
	}
	tick.Stop()
	mustGet(t, ctx, s, k)
	// Once keep-alives stop, the key goes within TTL + grace.
	h.waitGone(t, s, k, l.TTL+h.opts.ExpiryGrace+time.Second)
}

func testEndedLease(t *testing.T, h *harness) {
	s, ctx := h.store(t), h.ctx(t)
	l, err := s.Grant(ctx, 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Revoke(ctx, l.ID); err != nil {
		t.Fatal(err)
	}
	_, err = s.KeepAlive(ctx, l.ID)
	wantErr(t, "KeepAlive of a revoked lease", err, store.ErrLeaseNotFound)
	_, err = s.Put(ctx, h.key("k"), []byte("v"), store.WithLease(l.ID))
	wantErr(t, "Put with a revoked lease", err, store.ErrLeaseNotFound)
	if _, err := s.Get(ctx, h.key("k")); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Put with a revoked lease wrote the key: %v", err)
	}
	_, err = s.Create(ctx, h.key("k"), []byte("v"), store.WithLease(l.ID))
	wantErr(t, "Create with a revoked lease", err, store.ErrLeaseNotFound)
}

func testLeaseRebind(t *testing.T, h *harness) {
	s, ctx := h.store(t), h.ctx(t)
	l, err := s.Grant(ctx, 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	k := h.key("k")
	mustPut(t, ctx, s, k, "leased", store.WithLease(l.ID))
	if kv := mustGet(t, ctx, s, k); kv.Lease != l.ID {
		t.Fatalf("key bound to lease %x, want %x", kv.Lease, l.ID)
	}
	mustPut(t, ctx, s, k, "free") // no lease: the key leaves the lease
	if err := s.Revoke(ctx, l.ID); err != nil {
		t.Fatal(err)
	}
	if kv := mustGet(t, ctx, s, k); string(kv.Value) != "free" || kv.Lease != store.NoLease {
		t.Fatalf("after rebinding and revoke: %q lease %x", kv.Value, kv.Lease)
	}
}

// testKeepLease: an Update with KeepLease changes the value and leaves the
// key bound to its lease (the key still goes with it), whatever WithLease
// says; it needs the key.
func testKeepLease(t *testing.T, h *harness) {
	s, ctx := h.store(t), h.ctx(t)
	l, err := s.Grant(ctx, 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	other, err := s.Grant(ctx, 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	k := h.key("k")
	r1 := mustPut(t, ctx, s, k, "leased", store.WithLease(l.ID))
	r2, err := s.Update(ctx, k, []byte("changed"), r1, store.KeepLease(), store.WithLease(other.ID))
	if err != nil {
		t.Fatalf("Update with KeepLease: %v", err)
	}
	kv := mustGet(t, ctx, s, k)
	if string(kv.Value) != "changed" || kv.Lease != l.ID || kv.ModRevision != r2 || kv.CreateRevision != r1 {
		t.Fatalf("after Update with KeepLease: %q lease %x mod %d create %d, want %q lease %x mod %d create %d",
			kv.Value, kv.Lease, kv.ModRevision, kv.CreateRevision, "changed", l.ID, r2, r1)
	}
	free := h.key("free")
	rf := mustPut(t, ctx, s, free, "free")
	if _, err := s.Update(ctx, free, []byte("still free"), rf, store.KeepLease()); err != nil {
		t.Fatalf("Update with KeepLease of a key without lease: %v", err)
	}
	if kv := mustGet(t, ctx, s, free); kv.Lease != store.NoLease || string(kv.Value) != "still free" {
		t.Fatalf("a key without lease got lease %x (%q)", kv.Lease, kv.Value)
	}
	_, err = s.Update(ctx, h.key("absent"), []byte("x"), r1, store.KeepLease())
	wantErr(t, "Update with KeepLease of an absent key", err, store.ErrNotFound)
	if err := s.Revoke(ctx, l.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, k); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the key outlived its lease after an Update with KeepLease: %v", err)
	}
	_ = s.Revoke(ctx, other.ID)
}

// writeN puts n keys under the check's prefix and returns their revisions.
func writeN(t *testing.T, ctx context.Context, h *harness, s store.Store, n int) []int64 {
	t.Helper()
	revs := make([]int64, n)
	for i := range n {
		revs[i] = mustPut(t, ctx, s, h.key(fmt.Sprintf("k%d", i%7)), fmt.Sprint(i))
	}
	return revs
}

func testWatchOrdering(t *testing.T, h *harness) {
	s, ctx := h.store(t), h.ctx(t)
	_, rev, err := s.List(ctx, h.prefix)
	if err != nil {
		t.Fatal(err)
	}
	w := s.Watch(ctx, h.prefix, rev+1)
	revs := writeN(t, ctx, h, s, 100)
	evs := h.events(t, w, 100)
	for i, e := range evs {
		if e.Type != store.EventPut || e.Revision() != revs[i] || string(e.KV.Value) != fmt.Sprint(i) {
			t.Fatalf("event %d = %s %s@%d %q, want PUT @%d %q", i, e.Type, e.KV.Key, e.Revision(), e.KV.Value, revs[i], fmt.Sprint(i))
		}
	}
}

func testWatchExactlyOnce(t *testing.T, h *harness) {
	s, ctx := h.store(t), h.ctx(t)
	_, rev, err := s.List(ctx, h.prefix)
	if err != nil {
		t.Fatal(err)
	}
	// Several watchers of one prefix, writers racing: every watcher sees
	// every write exactly once.
	const writers, each = 4, 25
	ws := make([]store.WatchChan, 3)
	for i := range ws {
		ws[i] = s.Watch(ctx, h.prefix, rev+1)
	}
	var wg sync.WaitGroup
	errc := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if _, err := s.Put(ctx, h.key(fmt.Sprintf("w%d", w)), []byte(fmt.Sprint(i))); err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	for _, w := range ws {
		evs := h.events(t, w, writers*each)
		seen := map[int64]bool{}
		for _, e := range evs {
			if seen[e.Revision()] {
				t.Fatalf("revision %d delivered twice", e.Revision())
			}
			seen[e.Revision()] = true
		}
	}
	marker := mustPut(t, ctx, s, h.key("marker"), "m")
	for _, w := range ws {
		h.expectNext(t, w, h.key("marker"), marker)
	}
}

func testWatchResume(t *testing.T, h *harness) {
	s, ctx := h.store(t), h.ctx(t)
	revs := writeN(t, ctx, h, s, 30)
	for _, from := range []int{0, 13, 29} {
		w := s.Watch(ctx, h.prefix, revs[from])
		evs := h.events(t, w, len(revs)-from)
		for i, e := range evs {
			if e.Revision() != revs[from+i] {
				t.Fatalf("watch from %d: event %d at %d, want %d", revs[from], i, e.Revision(), revs[from+i])
			}
		}
	}
	// A revision between two writes of this prefix starts at the next one.
	w := s.Watch(ctx, h.prefix, revs[len(revs)-1]+1)
	h.expectOnly(t, s, w, h.key("marker"))
}

func testWatchFromNow(t *testing.T, h *harness) {
	s, ctx := h.store(t), h.ctx(t)
	before := mustPut(t, ctx, s, h.key("before"), "old")
	w := s.Watch(ctx, h.prefix, 0)
	// The watch may take a moment to be established on a remote backend:
	// keep writing until it reports, then check it did not replay history.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(h.opts.Timeout)
	for i := 0; ; i++ {
		select {
		case resp, ok := <-w:
			if !ok || resp.Err != nil {
				t.Fatalf("watch ended: %v", resp.Err)
			}
			if e := resp.Events[0]; e.Revision() <= before || e.KV.Key == h.key("before") {
				t.Fatalf("watch from now replayed %s@%d (written at %d, before the watch)", e.KV.Key, e.Revision(), before)
			}
			return
		case <-tick.C:
			mustPut(t, ctx, s, h.key("after"), fmt.Sprint(i))
		case <-deadline:
			t.Fatal("watch from now saw nothing")
		}
	}
}

func testListThenWatch(t *testing.T, h *harness) {
	s, ctx := h.store(t), h.ctx(t)
	writeN(t, ctx, h, s, 10)
	// A writer keeps going while we list and watch: the listing plus the
	// watch must equal the final state, with no gap and no overlap.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var last int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			rev, err := s.Put(ctx, h.key(fmt.Sprintf("k%d", i%7)), []byte(fmt.Sprint("live", i)))
			if err != nil {
				return
			}
			last = rev
			if i >= 200 {
				return
			}
		}
	}()
	kvs, rev, err := s.List(ctx, h.prefix)
	if err != nil {
		t.Fatal(err)
	}
	w := s.Watch(ctx, h.prefix, rev+1)
	close(stop)
	wg.Wait()
	state := map[string]string{}
	for _, kv := range kvs {
		state[kv.Key] = string(kv.Value)
	}
	for seen := rev; seen < last; {
		resp, ok := h.response(t, w)
		if !ok || resp.Err != nil {
			t.Fatalf("watch ended: %v", resp.Err)
		}
		for _, e := range resp.Events {
			if e.Revision() <= rev {
				t.Fatalf("watch from %d delivered revision %d, already in the listing", rev+1, e.Revision())
			}
			state[e.KV.Key] = string(e.KV.Value)
			seen = e.Revision()
		}
	}
	final, _, err := s.List(ctx, h.prefix)
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range final {
		if state[kv.Key] != string(kv.Value) {
			t.Fatalf("listing + watch gives %q=%q, the store holds %q", kv.Key, state[kv.Key], kv.Value)
		}
	}
	if len(final) != len(state) {
		t.Fatalf("listing + watch gives %d keys, the store holds %d", len(state), len(final))
	}
}

func testWatchPrefixIsolation(t *testing.T, h *harness) {
	s, ctx := h.store(t), h.ctx(t)
	w := s.Watch(ctx, h.key("a/b/"), 0)
	// Establish the watch (see testWatchFromNow), then write around it.
	h.expectEstablished(t, s, w, h.key("a/b/probe"))
	mustPut(t, ctx, s, h.key("a/bc/x"), "other")
	mustPut(t, ctx, s, h.key("a/b"), "parent")
	mustPut(t, ctx, s, h.key("a/c/x"), "sibling")
	h.expectOnly(t, s, w, h.key("a/b/x"))
}

// expectEstablished writes probe until w reports it, then drains nothing
// else: it makes a watch "from now" usable for exact expectations.
func (h *harness) expectEstablished(t *testing.T, s store.Store, w store.WatchChan, probe string) {
	t.Helper()
	ctx := h.ctx(t)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(h.opts.Timeout)
	for {
		select {
		case resp, ok := <-w:
			if !ok || resp.Err != nil {
				t.Fatalf("watch ended: %v", resp.Err)
			}
			for _, e := range resp.Events {
				if e.KV.Key != probe {
					t.Fatalf("unexpected event %s while establishing the watch", describe(resp.Events))
				}
			}
			// Later probes may still be in flight: delete marks the end.
			rev, err := s.Delete(ctx, probe)
			if err != nil {
				t.Fatal(err)
			}
			for {
				resp, ok := h.response(t, w)
				if !ok || resp.Err != nil {
					t.Fatalf("watch ended: %v", resp.Err)
				}
				for _, e := range resp.Events {
					if e.KV.Key != probe {
						t.Fatalf("unexpected event %s while establishing the watch", describe(resp.Events))
					}
					if e.Revision() == rev {
						return
					}
				}
			}
		case <-tick.C:
			mustPut(t, ctx, s, probe, "probe")
		case <-deadline:
			t.Fatal("watch never established")
		}
	}
}

func testWatchCancel(t *testing.T, h *harness) {
	s := h.store(t)
	ctx, cancel := context.WithCancel(h.ctx(t))
	w := s.Watch(ctx, h.prefix, 0)
	cancel()
	deadline := time.After(h.opts.Timeout)
	for {
		select {
		case _, ok := <-w:
			if !ok {
				return
			}
		case <-deadline:
			t.Fatal("watch channel not closed after cancel")
		}
	}
}

func testCreateRace(t *testing.T, h *harness) {
	s, ctx := h.store(t), h.ctx(t)
	const racers = 16
	k := h.key("k")
	var wg sync.WaitGroup
	results := make(chan error, racers)
	for i := range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := s.Create(ctx, k, []byte(fmt.Sprint(i)))
			results <- err
		}()
	}
	wg.Wait()
	close(results)
	won := 0
	for err := range results {
		switch {
		case err == nil:
			won++
		case !errors.Is(err, store.ErrKeyExists):
			t.Fatalf("Create race: %v", err)
		}
	}
	if won != 1 {
		t.Fatalf("%d of %d racing Creates succeeded, want exactly 1", won, racers)
	}
}

func testCASCounter(t *testing.T, h *harness) {
	s, ctx := h.store(t), h.ctx(t)
	k := h.key("counter")
	mustPut(t, ctx, s, k, "0")
	const workers, each = 6, 15
	var wg sync.WaitGroup
	errc := make(chan error, workers)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for done := 0; done < each; {
				kv, err := s.Get(ctx, k)
				if err != nil {
					errc <- err
					return
				}
				var n int
				if _, err := fmt.Sscan(string(kv.Value), &n); err != nil {
					errc <- fmt.Errorf("counter holds %q, not a number: %w", kv.Value, err)
					return
				}
				_, err = s.Update(ctx, k, []byte(fmt.Sprint(n+1)), kv.ModRevision)
				switch {
				case err == nil:
					done++
				case !errors.Is(err, store.ErrConflict):
					errc <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	if kv := mustGet(t, ctx, s, k); string(kv.Value) != fmt.Sprint(workers*each) {
		t.Fatalf("counter = %s after %d compare-and-swap increments", kv.Value, workers*each)
	}
}

func testValueSize(t *testing.T, h *harness) {
	s, ctx := h.store(t), h.ctx(t)
	big := bytes.Repeat([]byte("x"), store.MaxValueSize)
	big[0], big[len(big)-1] = 'a', 'z'
	if _, err := s.Put(ctx, h.key("max"), big); err != nil {
		t.Fatalf("Put of a %d-byte value (the limit): %v", len(big), err)
	}
	if kv := mustGet(t, ctx, s, h.key("max")); !bytes.Equal(kv.Value, big) {
		t.Fatalf("value of %d bytes read back as %d bytes", len(big), len(kv.Value))
	}
	_, err := s.Put(ctx, h.key("over"), append(big, 'x'))
	wantErr(t, "Put over the value limit", err, store.ErrValueTooLarge)
	_, err = s.Create(ctx, h.key("over"), append(big, 'x'))
	wantErr(t, "Create over the value limit", err, store.ErrValueTooLarge)
	if _, err := s.Get(ctx, h.key("over")); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a refused value was written: %v", err)
	}
	long := h.prefix + strings.Repeat("k", store.MaxKeySize-len(h.prefix))
	if _, err := s.Put(ctx, long, []byte("v")); err != nil {
		t.Fatalf("Put of a %d-byte key (the limit): %v", len(long), err)
	}
	mustGet(t, ctx, s, long)
	_, err = s.Put(ctx, long+"k", []byte("v"))
	wantErr(t, "Put of a key over the limit", err, store.ErrInvalidKey)
}

func testInvalidInput(t *testing.T, h *harness) {
	s, ctx := h.store(t), h.ctx(t)
	_, err := s.Put(ctx, "", []byte("v"))
	wantErr(t, "Put of the empty key", err, store.ErrInvalidKey)
	_, err = s.Get(ctx, "")
	wantErr(t, "Get of the empty key", err, store.ErrInvalidKey)
	_, err = s.Put(ctx, h.key("bad\xff"), []byte("v"))
	wantErr(t, "Put of a non-UTF-8 key", err, store.ErrInvalidKey)
	for _, ttl := range []time.Duration{0, -time.Second, time.Millisecond, store.MaxLeaseTTL + time.Second} {
		_, err := s.Grant(ctx, ttl)
		wantErr(t, fmt.Sprintf("Grant(%v)", ttl), err, store.ErrInvalidTTL)
	}
	w := s.Watch(ctx, "bad\xff", 0)
	resp, ok := h.response(t, w)
	if !ok || !errors.Is(resp.Err, store.ErrInvalidKey) {
		t.Fatalf("Watch of a non-UTF-8 prefix: %v (open %v)", resp.Err, ok)
	}
}

func testTxnAtomic(t *testing.T, h *harness) {
	s, ctx := h.store(t), h.ctx(t)
	tx, ok := s.(store.Transactor)
	if !ok {
		t.Fatalf("%T does not implement store.Transactor: it is optional, so declare the caveat %q (Options.Caveats) saying so", s, "Txn/Atomic")
	}
	a, b := h.key("a"), h.key("b")
	ra := mustPut(t, ctx, s, a, "a0")
	_, rev, err := s.List(ctx, h.prefix)
	if err != nil {
		t.Fatal(err)
	}
	w := s.Watch(ctx, h.prefix, rev+1)
	r, err := tx.Txn(ctx,
		store.Op{Kind: store.OpPut, Key: a, Value: []byte("a1"), IfModRevision: ra},
		store.Op{Kind: store.OpPut, Key: b, Value: []byte("b1"), IfAbsent: true})
	if err != nil {
		t.Fatal(err)
	}
	resp, ok := h.response(t, w)
	if !ok || resp.Err != nil || len(resp.Events) != 2 || resp.Events[0].Revision() != r || resp.Events[1].Revision() != r {
		t.Fatalf("transaction events: %v (err %v), want two at revision %d", describe(resp.Events), resp.Err, r)
	}
	// A failed precondition applies nothing.
	_, err = tx.Txn(ctx,
		store.Op{Kind: store.OpDelete, Key: a},
		store.Op{Kind: store.OpPut, Key: b, Value: []byte("b2"), IfAbsent: true})
	wantErr(t, "transaction with a failed precondition", err, store.ErrConflict)
	var ce *store.ConflictError
	if !errors.As(err, &ce) || ce.Key != b {
		t.Fatalf("conflict error %v does not name %q", err, b)
	}
	if kv := mustGet(t, ctx, s, a); string(kv.Value) != "a1" {
		t.Fatalf("failed transaction changed %q to %q", a, kv.Value)
	}
	h.expectOnly(t, s, w, h.key("marker"))
}

func testCloseIdempotent(t *testing.T, h *harness) {
	s := h.newStore(t)
	ctx := h.ctx(t)
	mustPut(t, ctx, s, h.key("k"), "v")
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	_, err := s.Get(ctx, h.key("k"))
	wantErr(t, "Get after Close", err, store.ErrClosed)
	_, err = s.Put(ctx, h.key("k"), []byte("v"))
	wantErr(t, "Put after Close", err, store.ErrClosed)
	_, err = s.Grant(ctx, time.Minute)
	wantErr(t, "Grant after Close", err, store.ErrClosed)
	w := s.Watch(ctx, h.prefix, 0)
	resp, ok := h.response(t, w)
	if ok && !errors.Is(resp.Err, store.ErrClosed) {
		t.Fatalf("Watch after Close delivered %v", resp)
	}
}

func testWatchCompacted(t *testing.T, h *harness) {
	s, ctx := h.store(t), h.ctx(t)
	compact := h.opts.Compact
	if compact == nil {
		c, ok := s.(store.Compactor)
		if !ok {
			t.Fatalf("%T neither implements store.Compactor nor sets Options.Compact: declare the caveat %q (Options.Caveats) saying why", s, "Watch/Compacted")
		}
		compact = func(ctx context.Context, _ store.Store, rev int64) error { return c.Compact(ctx, rev) }
	}
	revs := writeN(t, ctx, h, s, 6)
	if err := compact(ctx, s, revs[4]); err != nil {
		t.Fatalf("compact to %d: %v", revs[4], err)
	}
	resp, ok := h.response(t, s.Watch(ctx, h.prefix, revs[1]))
	if !ok {
		t.Fatal("watch from a compacted revision closed without an error")
	}
	wantErr(t, "watch from a compacted revision", resp.Err, store.ErrCompacted)
	var ce *store.CompactedError
	if !errors.As(resp.Err, &ce) || ce.CompactRevision < revs[4] {
		t.Fatalf("compaction error %v does not report the compact revision %d", resp.Err, revs[4])
	}
	// The current state is intact, and watching from the compact
	// revision on still works.
	kvs, _, err := s.List(ctx, h.prefix)
	if err != nil || len(kvs) != 6 {
		t.Fatalf("List after compaction: %v, %v", keys(kvs), err)
	}
	evs := h.events(t, s.Watch(ctx, h.prefix, revs[4]), 2)
	if evs[0].Revision() != revs[4] || evs[1].Revision() != revs[5] {
		t.Fatalf("watch from the compact revision: %v", describe(evs))
	}
}

func testNoLeaks(t *testing.T, h *harness) {
	before := goleak.IgnoreCurrent()
	s := h.newStore(t)
	ctx, cancel := context.WithCancel(h.ctx(t))
	var ws []store.WatchChan
	for i := range 20 {
		wctx := ctx
		if i >= 10 {
			wctx = h.ctx(t) // ended by Close, not by cancel
		}
		ws = append(ws, s.Watch(wctx, h.key(fmt.Sprint(i%3))+"/", 0))
	}
	mustPut(t, ctx, s, h.key("0", "x"), "v")
	l, err := s.Grant(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.KeepAlive(ctx, l.ID); err != nil {
		t.Fatal(err)
	}
	// Half the watches end by cancel, the rest by Close.
	cancel()
	for _, w := range ws[:10] {
		drain(t, w, h.opts.Timeout)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for _, w := range ws[10:] {
		drain(t, w, h.opts.Timeout)
	}
	goleak.VerifyNone(t, append([]goleak.Option{before}, h.opts.LeakOptions...)...)
}

func drain(t *testing.T, w store.WatchChan, timeout time.Duration) {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case _, ok := <-w:
			if !ok {
				return
			}
		case <-deadline:
			t.Fatal("watch channel not closed")
		}
	}
}
