package registry

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"github.com/beaconplane/beacon/internal/testkit/storefault"
	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/etcd"
	"github.com/beaconplane/beacon/store/memory"
)

// feedRig drives one feed by hand: no goroutine lists or watches the
// store, the test hands the feed listings and events (applyListing,
// applyEvents, setStale, setOutage) and reads each cursor's next step, so every
// rule of the feed and the cursor is checked without timing. The oracle
// is explicit expected kinds, revisions and addresses.
type feedRig struct {
	t *testing.T
	r *StoreRegistry
	f *feed
}

func newFeedRig(t *testing.T) *feedRig {
	t.Helper()
	return newFeedRigWith(t, Config{RemovalHold: -1})
}

// newFeedRigWith is newFeedRig with a registry configured as cfg says.
func newFeedRigWith(t *testing.T, cfg Config) *feedRig {
	t.Helper()
	st := memory.New(memory.Config{})
	t.Cleanup(func() { _ = st.Close() })
	r, err := New(st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return &feedRig{t: t, r: r, f: newFeed(ctx, cancel, r.hub, beacon.Query{Namespace: "feed"})}
}

// kv is instance id's stored value with address addr.
func (g *feedRig) kv(id uint64, addr string, create, mod int64) store.KeyValue {
	g.t.Helper()
	in := beacon.Instance{Namespace: "feed", Component: "c", Endpoint: "e", ID: beacon.FormatID(id), Address: addr,
		Status: beacon.StatusServing, RegisteredAt: time.Unix(1, 0).UTC()}
	val, err := encode(in, time.Minute)
	if err != nil {
		g.t.Fatal(err)
	}
	return store.KeyValue{Key: g.r.ks.Key(in.Ref()), Value: val, CreateRevision: create, ModRevision: mod}
}

// batch returns c's next batch, failing unless one is ready.
func (g *feedRig) batch(c *cursor) Batch {
	g.t.Helper()
	s := g.f.next(c)
	if s.err != nil || !s.ok {
		g.t.Fatalf("no batch ready: %+v", s)
	}
	return s.batch
}

// start hands the feed its first listing, kv at rev, and returns a cursor
// that took its Snapshot.
func (g *feedRig) start(kv store.KeyValue, rev int64) *cursor {
	g.t.Helper()
	g.f.applyListing([]store.KeyValue{kv}, rev)
	c := &cursor{}
	wantEvents(g.t, g.batch(c), Snapshot, "added "+g.addr(kv))
	return c
}

// addr is the address kv stores.
func (g *feedRig) addr(kv store.KeyValue) string {
	in, err := g.r.decode(kv)
	if err != nil {
		g.t.Fatal(err)
	}
	return in.Address
}

// idle fails unless c has nothing to deliver.
func (g *feedRig) idle(c *cursor) {
	g.t.Helper()
	if s := g.f.next(c); s.ok || s.err != nil {
		g.t.Fatalf("a batch where none is due: %v %+v (err %v)", s.batch.Kind, s.batch.Events, s.err)
	}
}

// addresses lists the events as "type address".
func addresses(b Batch) []string {
	var out []string
	for _, e := range b.Events {
		out = append(out, e.Type.String()+" "+e.Instance.Address)
	}
	return out
}

func wantEvents(t *testing.T, b Batch, kind BatchKind, want ...string) {
	t.Helper()
	got := addresses(b)
	if b.Kind != kind || len(got) != len(want) {
		t.Fatalf("batch %v %v, want %v %v", b.Kind, got, kind, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("batch %v %v, want %v %v", b.Kind, got, kind, want)
		}
	}
}

// A re-listing that was not announced by a Stale batch (a compaction, a
// broken stream) is delivered as a Resync, never as plain Changes.
func TestFeedRelistIsAResync(t *testing.T) {
	g := newFeedRig(t)
	c := g.start(g.kv(1, "10.0.0.1:80", 5, 5), 10)
	g.f.applyListing([]store.KeyValue{g.kv(1, "10.0.0.2:80", 5, 12)}, 12)
	b := g.batch(c)
	wantEvents(t, b, Resync, "updated 10.0.0.2:80")
	if b.Revision != 12 {
		t.Fatalf("Resync at revision %d, want 12", b.Revision)
	}
	g.idle(c)
}

// A watch event at or below the revision the feed holds is already in its
// state (a listing overtook the watch): it is ignored, whatever it holds.
func TestFeedIgnoresEventsTheListingCovers(t *testing.T) {
	g := newFeedRig(t)
	c := g.start(g.kv(1, "10.0.0.1:80", 5, 10), 10)
	at := func(kv store.KeyValue) store.Event { return store.Event{Type: store.EventPut, KV: kv} }
	g.f.applyEvents([]store.Event{at(g.kv(1, "10.0.0.9:80", 5, 10)), at(g.kv(2, "10.0.0.8:80", 9, 9))})
	g.idle(c)
	if it, _ := g.f.view.Get(g.kv(1, "", 0, 0).Key); it.Inst.Address != "10.0.0.1:80" {
		t.Fatalf("an event at the listed revision changed the view: %s", it.Inst.Address)
	}
	g.f.applyEvents([]store.Event{at(g.kv(2, "10.0.0.2:80", 11, 11))})
	wantEvents(t, g.batch(c), Changes, "added 10.0.0.2:80")
}

// A re-listed key whose modification revision is the same but whose
// creation revision differs is another write (the store's history was
// replaced: a restore): it is delivered, not kept as unchanged.
func TestFeedRelistComparesCreationRevisions(t *testing.T) {
	g := newFeedRig(t)
	c := g.start(g.kv(1, "10.0.0.1:80", 5, 8), 10)
	g.f.applyListing([]store.KeyValue{g.kv(1, "10.0.0.2:80", 3, 8)}, 10)
	wantEvents(t, g.batch(c), Resync, "updated 10.0.0.2:80")
}

// When the store's revision goes backwards the feed's history starts again
// at the new listing: a watcher resuming from that revision resumes (and
// gets what came after it), not a snapshot of a history that no longer
// exists.
func TestFeedRevisionBackwardsStartsTheHistoryAgain(t *testing.T) {
	g := newFeedRig(t)
	g.f.applyListing([]store.KeyValue{g.kv(1, "10.0.0.1:80", 5, 5)}, 100)
	g.f.applyListing([]store.KeyValue{g.kv(1, "10.0.0.1:80", 5, 5), g.kv(2, "10.0.0.2:80", 40, 40)}, 50)
	g.f.applyEvents([]store.Event{{Type: store.EventPut, KV: g.kv(3, "10.0.0.3:80", 51, 51)}})
	c := &cursor{from: 50, fromChecked: true}
	b := g.batch(c)
	wantEvents(t, b, Changes, "added 10.0.0.3:80")
	if b.Revision != 51 {
		t.Fatalf("resumed at revision %d, want 51", b.Revision)
	}
}

// A disconnection is reported once with one Stale batch, however often it
// is marked; after the re-listing clears it (a Resync), the next
// disconnection is reported again.
func TestFeedStaleOncePerDisconnection(t *testing.T) {
	g := newFeedRig(t)
	c := g.start(g.kv(1, "10.0.0.1:80", 5, 5), 10)
	lost := errors.New("store unreachable")
	g.f.setOutage(lost)
	if b := g.batch(c); b.Kind != Stale || !errors.Is(b.Err, lost) || b.Revision != 10 {
		t.Fatalf("first batch after a disconnection: %v (err %v) at %d, want Stale at 10", b.Kind, b.Err, b.Revision)
	}
	g.f.setOutage(lost)
	g.f.setStale(lost)
	g.idle(c)
	g.f.applyListing([]store.KeyValue{g.kv(1, "10.0.0.1:80", 5, 5)}, 11)
	wantEvents(t, g.batch(c), Resync)
	g.idle(c)
	g.f.setStale(lost)
	if b := g.batch(c); b.Kind != Stale {
		t.Fatalf("second disconnection delivered %v, want Stale", b.Kind)
	}
}

// An outage mark ends when the feed's store watch delivers again: the
// watch resumed without a gap (store.Watcher's contract), so the view
// missed nothing and is not re-listed. The watchers get the Resync that
// ends their Stale batch, with the changes the watch brought.
func TestFeedOutageEndsWhenItsWatchDeliversAgain(t *testing.T) {
	g := newFeedRig(t)
	c := g.start(g.kv(1, "10.0.0.1:80", 5, 5), 10)
	g.f.setOutage(errors.New("store unreachable"))
	if b := g.batch(c); b.Kind != Stale {
		t.Fatalf("after the outage mark: %v, want Stale", b.Kind)
	}
	relists := g.f.cur.Relists
	g.f.applyEvents([]store.Event{{Type: store.EventPut, KV: g.kv(2, "10.0.0.2:80", 11, 11)}})
	wantEvents(t, g.batch(c), Resync, "added 10.0.0.2:80")
	if g.f.cur.Relists != relists {
		t.Fatal("the feed re-listed to end an outage its watch came back from")
	}
	g.idle(c)
	g.f.setOutage(errors.New("store unreachable again"))
	if b := g.batch(c); b.Kind != Stale {
		t.Fatalf("a second outage: %v, want Stale (the first one ended)", b.Kind)
	}
	g.f.applyEvents(nil) // a progress notification: no change, the watch live
	wantEvents(t, g.batch(c), Resync)
	g.idle(c)
}

// A silent store watch is not a store outage: the registrants renew
// through the members that answer, so a removal the resumed watch
// delivers is a death, coalesced only; after the store was unreachable,
// the first removals are held for re-registrations (etcd may end leases
// their registrants could not renew).
func TestFeedSilenceIsNoOutageForRemovals(t *testing.T) {
	for _, outage := range []bool{false, true} {
		g := newFeedRigWith(t, Config{}) // removal holds on
		kv := g.kv(1, "10.0.0.1:80", 5, 5)
		c := g.start(kv, 10)
		g.f.mu.Lock()
		if outage {
			g.f.conn.setOutage(errors.New("store unreachable"))
		} else {
			g.f.conn.setSilent(fmt.Errorf("watch: %w", store.ErrWatchSilent))
		}
		g.f.wake.Notify()
		g.f.unlock()
		if b := g.batch(c); b.Kind != Stale {
			t.Fatalf("outage %v: %v, want Stale", outage, b.Kind)
		}
		g.f.applyEvents([]store.Event{{Type: store.EventDelete, KV: store.KeyValue{Key: kv.Key, ModRevision: 11}}})
		g.f.mu.RLock()
		p := g.f.holds.pending[kv.Key]
		g.f.mu.RUnlock()
		if p == nil || p.held != outage {
			t.Fatalf("outage %v: the removal after the watch resumed is pending %v, held %v; want held %v",
				outage, p != nil, p != nil && p.held, outage)
		}
	}
}

// A stale mark with another cause than an unreachable store (a silent
// stream, a refusal), even on top of an outage mark, is ended only by a
// listing: changes the watch brings meanwhile are delivered as Changes
// (the view may still miss others), and the Resync comes with the listing.
func TestFeedStaleForAnotherCauseWaitsForAListing(t *testing.T) {
	for _, order := range []string{"outage then silent", "silent then outage"} {
		t.Run(order, func(t *testing.T) {
			g := newFeedRig(t)
			c := g.start(g.kv(1, "10.0.0.1:80", 5, 5), 10)
			outage, silent := errors.New("store unreachable"), fmt.Errorf("watch: %w", store.ErrWatchSilent)
			if order == "outage then silent" {
				g.f.setOutage(outage)
				g.f.setStale(silent)
			} else {
				g.f.setStale(silent)
				g.f.setOutage(outage)
			}
			if b := g.batch(c); b.Kind != Stale {
				t.Fatalf("after the marks: %v, want Stale", b.Kind)
			}
			g.f.applyEvents([]store.Event{{Type: store.EventPut, KV: g.kv(2, "10.0.0.2:80", 11, 11)}})
			wantEvents(t, g.batch(c), Changes, "added 10.0.0.2:80")
			g.idle(c)
			g.f.applyListing([]store.KeyValue{g.kv(1, "10.0.0.1:80", 5, 5), g.kv(2, "10.0.0.2:80", 11, 11),
				g.kv(3, "10.0.0.3:80", 12, 12)}, 12)
			wantEvents(t, g.batch(c), Resync, "added 10.0.0.3:80")
			g.idle(c)
		})
	}
}

// A feed the store refuses (the credentials or the permission were
// withdrawn) is stopped when its last watcher leaves rather than kept
// warm: lingering would only keep retrying what the store refuses.
func TestHubStopsARefusedFeedAtOnce(t *testing.T) {
	st := memory.New(memory.Config{})
	t.Cleanup(func() { _ = st.Close() })
	r, err := New(st, Config{WatchLinger: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, refusedFeed := range []bool{false, true} {
		q := beacon.Query{Namespace: map[bool]string{false: "warm", true: "refused"}[refusedFeed]}
		w, err := r.Watch(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Next(ctx); err != nil { // listed: nothing clears the stale mark below
			t.Fatal(err)
		}
		if refusedFeed {
			r.hub.mu.Lock()
			f := r.hub.feeds[r.ks.Prefix(q)]
			r.hub.mu.Unlock()
			f.setStale(fmt.Errorf("registry: watch: %w", store.ErrPermissionDenied))
		}
		before := r.WatchStreams()
		_ = w.Close()
		want := before
		if refusedFeed {
			want--
		}
		if got := r.WatchStreams(); got != want {
			t.Fatalf("refused=%v: %d store watches after the last watcher left, want %d", refusedFeed, got, want)
		}
	}
}

// When the hub's probe finds the store unreachable, every watcher gets a
// Stale batch; when it answers again, the probe has every feed re-list,
// and the watchers get a Resync (the feed's own store watch never broke,
// so nothing else would end the Stale state).
func TestProbeRelistsFeedsWhenTheStoreIsBack(t *testing.T) {
	ctx, g := memFaultRig(t, 0, "probe")
	if b := g.outageAndBack(ctx, t); b.Kind != Resync {
		t.Fatalf("once the store answers again: %v; want a Resync", b.Kind)
	}
}

// faultRig is a registry over a storefault.Store, probing the store
// every second, and one watch of q that took its Snapshot.
type faultRig struct {
	r  *StoreRegistry
	st *storefault.Store
	w  Watcher
	q  beacon.Query
}

func newFaultRig(ctx context.Context, t *testing.T, st *storefault.Store, ns string) *faultRig {
	t.Helper()
	r, err := New(st, Config{RetryMax: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	t.Cleanup(st.Free) // before Close: a probe read held when the test fails
	g := &faultRig{r: r, st: st, q: beacon.Query{Namespace: ns}}
	g.w = g.watch(ctx, t, ns)
	return g
}

// memFaultRig is newFaultRig over a new memory store promising progress
// every interval; ctx ends with the test, or after a minute.
func memFaultRig(t *testing.T, interval time.Duration, ns string) (context.Context, *faultRig) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	mem := memory.New(memory.Config{})
	t.Cleanup(func() { _ = mem.Close() })
	return ctx, newFaultRig(ctx, t, storefault.New(mem, interval), ns)
}

// watch opens a watch of namespace ns that took its Snapshot.
func (g *faultRig) watch(ctx context.Context, t *testing.T, ns string) Watcher {
	t.Helper()
	w, err := g.r.Watch(ctx, beacon.Query{Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close() })
	if b, err := w.Next(ctx); err != nil || b.Kind != Snapshot {
		t.Fatalf("%s: first batch %v, %v; want a Snapshot", ns, b.Kind, err)
	}
	return w
}

// outageAndBack makes the store unreachable until the watch reports
// Stale, then reachable again, and returns the watch's next batch.
func (g *faultRig) outageAndBack(ctx context.Context, t *testing.T) Batch {
	t.Helper()
	g.st.GoDown()
	if b := serve(ctx, t, g.st, g.w); b.Kind != Stale || !errors.Is(b.Err, store.ErrUnavailable) {
		t.Fatalf("while the store does not answer: %v (%v), want Stale", b.Kind, b.Err)
	}
	g.st.ComeBack()
	return serve(ctx, t, g.st, g.w)
}

// serve fails the probe's reads until the watcher's next batch, which it
// returns.
func serve(ctx context.Context, t *testing.T, s *storefault.Store, w Watcher) Batch {
	t.Helper()
	batches := make(chan Batch, 1)
	errs := make(chan error, 1)
	go func() {
		b, err := w.Next(ctx)
		if err != nil {
			errs <- err
			return
		}
		batches <- b
	}()
	for {
		select {
		case <-s.Pinged():
			s.Release()
		case b := <-batches:
			return b
		case err := <-errs:
			t.Fatal(err)
		}
	}
}

// relists returns how many times the feed of q re-listed.
func relists(r *StoreRegistry, q beacon.Query) uint64 {
	r.hub.mu.Lock()
	f := r.hub.feeds[r.feedKey(q)]
	r.hub.mu.Unlock()
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.view.Relists()
}

// A store that does not answer the hub's probe in time while it still
// streams events (a cluster past its capacity) makes stale only the feeds
// that heard nothing meanwhile: a feed whose store watch delivered during
// the probe stays current and is not re-listed when the probe succeeds
// again; the quiet feed gets Stale, then its Resync.
func TestProbeSparesFeedsWhoseWatchDelivers(t *testing.T) {
	ctx, g := memFaultRig(t, 0, "busy")
	r, busy, quiet, st, mem := g.r, g.w, g.watch(ctx, t, "quiet"), g.st, g.st.Store
	quietBatches := make(chan Batch)
	go func() {
		for {
			b, err := quiet.Next(ctx)
			if err != nil {
				return
			}
			select {
			case quietBatches <- b:
			case <-ctx.Done():
				return
			}
		}
	}()
	// Each of the probe's reads waits while the busy prefix gets a change
	// and its watcher the batch.
	put := func(i int) {
		in := beacon.Instance{Namespace: "busy", Component: "c", Endpoint: "e", ID: beacon.FormatID(uint64(i)),
			Address: fmt.Sprintf("10.0.0.%d:80", i%250+1), Status: beacon.StatusServing, RegisteredAt: time.Unix(1, 0).UTC()}
		val, err := encode(in, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := mem.Put(ctx, r.ks.Key(in.Ref()), val); err != nil {
			t.Fatal(err)
		}
		if b, err := busy.Next(ctx); err != nil || b.Kind != Changes {
			t.Fatalf("busy watcher while the probe waits: %v (%v), %v; want Changes", b.Kind, b.Err, err)
		}
	}
	st.GoDown()
	for i, want := 1, Stale; ; {
		select {
		case <-st.Pinged():
			put(i)
			i++
			st.Release()
		case b := <-quietBatches:
			if b.Kind != want {
				t.Fatalf("quiet watcher: %v (%v), want %v", b.Kind, b.Err, want)
			}
			if want == Resync {
				if n := relists(r, beacon.Query{Namespace: "busy"}); n != 0 {
					t.Fatalf("the busy feed re-listed %d times; its watch delivered throughout", n)
				}
				return
			}
			want = Resync
			st.ComeBack()
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
	}
}

// After an outage, a feed whose store promises progress and whose store
// watch still runs is not re-listed when the probe succeeds again: its
// watch's progress notification (etcd's, here a real one) ends the stale
// mark, and its watchers get the Resync without the store listing the
// prefix again.
func TestProbeLeavesAQuietWatchToProveItself(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	est, err := etcd.Open(ctx, etcd.Config{Endpoints: srv.Endpoints(), WatchSilenceTimeout: 800 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = est.Close() })
	g := newFaultRig(ctx, t, storefault.New(est, est.ProgressInterval()), "quiet")
	if b := g.outageAndBack(ctx, t); b.Kind != Resync || len(b.Events) != 0 {
		t.Fatalf("once the store answers: %v %v, want an empty Resync", b.Kind, b.Events)
	}
	if n := relists(g.r, g.q); n != 0 {
		t.Fatalf("the feed re-listed %d times; its watch's progress ends the outage", n)
	}
}

// A store that promises progress and does not deliver it (here: plain
// watches) gets its stale feeds re-listed all the same, twice its
// interval after it answers again: a broken promise costs time, never
// a watch stale for good.
func TestProbeRelistsAWatchThatReportsNoProgress(t *testing.T) {
	ctx, g := memFaultRig(t, 50*time.Millisecond, "promised")
	if b := g.outageAndBack(ctx, t); b.Kind != Resync {
		t.Fatalf("once the store answers: %v, want a Resync", b.Kind)
	}
	if n := relists(g.r, g.q); n != 1 {
		t.Fatalf("the feed re-listed %d times, want once (no progress came)", n)
	}
}

// A store watch that ends silent (its server hangs, is cut off or too busy
// to answer) is opened again from the revision after the last one the
// feed applied, not listed again: the watchers get Stale, then the new
// watch's first event ends it with a Resync carrying that change.
func TestSilentWatchResumesWithoutAListing(t *testing.T) {
	ctx, g := memFaultRig(t, 0, "silent")
	r, w, q, st, mem := g.r, g.w, g.q, g.st, g.st.Store
	st.Silence()
	if b, err := w.Next(ctx); err != nil || b.Kind != Stale || !errors.Is(b.Err, store.ErrWatchSilent) {
		t.Fatalf("after the silence: %v (%v), %v; want Stale", b.Kind, b.Err, err)
	}
	in := beacon.Instance{Namespace: "silent", Component: "c", Endpoint: "e", ID: beacon.FormatID(7), Address: "10.0.0.7:80",
		Status: beacon.StatusServing, RegisteredAt: time.Unix(1, 0).UTC()}
	val, err := encode(in, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mem.Put(ctx, r.ks.Key(in.Ref()), val); err != nil {
		t.Fatal(err)
	}
	b, err := w.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wantEvents(t, b, Resync, "added 10.0.0.7:80")
	if n := relists(r, q); n != 0 {
		t.Fatalf("the feed listed its prefix again %d times after a silent watch", n)
	}
}
