package registry_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/registry/registrytest"
	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/etcd"
	"github.com/beaconplane/beacon/store/memory"
	"github.com/prometheus/client_golang/prometheus"
)

// next applies the next batch of w to v.
func next(t *testing.T, ctx context.Context, w registry.Watcher, v *registrytest.View) registry.Batch {
	t.Helper()
	b, err := w.Next(ctx)
	if err != nil {
		t.Fatalf("Next: %v (view %v)", err, v)
	}
	if err := v.Apply(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestWatchersShareOneUpstreamWatch opens 100 watchers of one query: the
// registry holds one shared feed, and the etcd server counts exactly one
// more watcher. (Not parallel: it reads a server-wide gauge.)
func TestWatchersShareOneUpstreamWatch(t *testing.T) {
	st := newEtcdStore(t, nil, etcd.Config{})
	r := newRegistry(t, st, registry.Config{WatchLinger: -1})
	ns := uniqueNS()
	ctx := within(t, 30*time.Second)
	if _, err := r.Register(ctx, inst(ns, "10.0.0.1:80")); err != nil {
		t.Fatal(err)
	}
	before := etcdtest.Watchers(t)
	q := beacon.Query{Namespace: ns}
	var (
		ws []registry.Watcher
		vs []*registrytest.View
	)
	for range 100 {
		w, err := r.Watch(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		ws = append(ws, w)
		v := registrytest.NewView()
		vs = append(vs, v)
		if b := next(t, ctx, w, v); b.Kind != registry.Snapshot || v.Len() != 1 {
			t.Fatalf("first batch %v with %v", b.Kind, v)
		}
	}
	// The snapshot comes from a listing; the store watch starts after it.
	// A change seen by every watcher proves the store watch is running
	// (and registered with etcd) before the count is read.
	if _, err := r.Register(ctx, inst(ns, "10.0.0.2:80")); err != nil {
		t.Fatal(err)
	}
	for i, w := range ws {
		for vs[i].Len() < 2 {
			next(t, ctx, w, vs[i])
		}
	}
	if n := r.WatchStreams(); n != 1 {
		t.Fatalf("registry holds %d store watches for one query, want 1", n)
	}
	if d := etcdtest.Watchers(t) - before; d != 1 {
		t.Fatalf("etcd counts %v more watchers for 100 registry watchers, want 1", d)
	}
	// Another query is another prefix: one more.
	other, err := r.Watch(ctx, beacon.Query{Namespace: ns, Component: "api"})
	if err != nil {
		t.Fatal(err)
	}
	if n := r.WatchStreams(); n != 2 {
		t.Fatalf("%d store watches for two queries", n)
	}
	_ = other.Close()
	for _, w := range ws {
		_ = w.Close()
	}
	if n := r.WatchStreams(); n != 0 {
		t.Fatalf("%d store watches left after closing every watcher (no linger)", n)
	}
}

// TestWatchLingerKeepsFeedWarm: a watch reopened within the linger period
// finds the shared feed still running and resumes from its revision with
// exactly the changes since.
func TestWatchLingerKeepsFeedWarm(t *testing.T) {
	st := newMemoryStore(t)
	r := newRegistry(t, st, registry.Config{LeaseTTL: time.Second})
	ns := uniqueNS()
	ctx := within(t, 30*time.Second)
	q := beacon.Query{Namespace: ns}
	a, err := r.Register(ctx, inst(ns, "10.0.0.1:80"))
	if err != nil {
		t.Fatal(err)
	}
	w, err := r.Watch(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	v := registrytest.NewView()
	first := next(t, ctx, w, v)
	_ = w.Close()
	if r.WatchStreams() != 1 {
		t.Fatal("the feed did not linger")
	}
	b, err := r.Register(ctx, inst(ns, "10.0.0.2:80"))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Update(ctx, func(in *beacon.Instance) { in.Address = "10.1.0.1:80" }); err != nil {
		t.Fatal(err)
	}

	w2, err := r.Watch(ctx, q, registry.FromRevision(first.Revision))
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Close()
	want, _, err := r.List(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	for !v.Equal(want) {
		nb := next(t, ctx, w2, v)
		if v.Batches == 2 && nb.Kind != registry.Changes {
			t.Fatalf("resumed watch began with %v, want changes", nb.Kind)
		}
	}
	if got := w2.Instances(); !registrytest.SameInstances(got, want) {
		t.Fatalf("resumed watcher's Instances() = %v", got)
	}
	_ = b

	// A revision from before the feed existed, or one the store reached by
	// writes outside the watched prefix (the feed never saw it), gets a
	// snapshot.
	other, err := st.Put(ctx, "/elsewhere", []byte("x"))
	if err != nil {
		t.Fatal(err)
	}
	for _, rev := range []int64{1, other} {
		w3, err := r.Watch(ctx, q, registry.FromRevision(rev))
		if err != nil {
			t.Fatal(err)
		}
		nb, err := w3.Next(ctx)
		_ = w3.Close()
		if err != nil || nb.Kind != registry.Snapshot || len(nb.Events) != 2 {
			t.Fatalf("resume from %d: %v with %d events, %v; want a snapshot of 2", rev, nb.Kind, len(nb.Events), err)
		}
	}
	if _, err := r.Watch(ctx, q, registry.FromRevision(-1)); !errors.Is(err, beacon.ErrInvalid) {
		t.Fatalf("negative revision: %v", err)
	}
	// A revision the store has not reached was never given: it was taken
	// silently as a fresh watch; now it is refused, saying so.
	w4, err := r.Watch(ctx, q, registry.FromRevision(other+1_000_000))
	if err != nil {
		t.Fatal(err)
	}
	defer w4.Close()
	if nb, err := w4.Next(ctx); !errors.Is(err, beacon.ErrInvalid) || !strings.Contains(err.Error(), fmt.Sprintf("the store is only at revision %d", other)) {
		t.Fatalf("resume from the future: %v, %v", nb.Kind, err)
	}
}

// putInstance writes an instance directly (as another process would),
// returning its revision.
func putInstance(t *testing.T, ctx context.Context, st store.Store, ks beacon.Keyspace, in beacon.Instance) int64 {
	t.Helper()
	val, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	rev, err := st.Put(ctx, ks.Key(in.Ref()), val)
	if err != nil {
		t.Fatal(err)
	}
	return rev
}

// TestSlowConsumerBeyondTheLog: a consumer that stays away for more changes
// than the feed's log keeps catches up by a full comparison, in one batch
// with one event per changed instance.
func TestSlowConsumerBeyondTheLog(t *testing.T) {
	st := newMemoryStore(t)
	r := newRegistry(t, st, registry.Config{})
	ns := uniqueNS()
	ctx := within(t, 60*time.Second)
	q := beacon.Query{Namespace: ns}
	const n = 20
	ins := make([]beacon.Instance, n)
	for i := range ins {
		ins[i] = inst(ns, fmt.Sprintf("10.0.0.%d:80", i+1))
		ins[i].ID = beacon.FormatID(uint64(i + 1))
		ins[i].RegisteredAt = time.Unix(1, 0).UTC()
		putInstance(t, ctx, st, r.Keyspace(), ins[i])
	}
	slow, err := r.Watch(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	fast, err := r.Watch(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	defer fast.Close()
	sv, fv := registrytest.NewView(), registrytest.NewView()
	next(t, ctx, slow, sv)
	next(t, ctx, fast, fv)
	if sv.Len() != n {
		t.Fatalf("snapshot %v", sv)
	}
	// 12,000 changes: more than the feed keeps (2 × 4096).
	const rounds = 600
	var lastRev int64
	for round := range rounds {
		for i := range ins {
			ins[i].Address = fmt.Sprintf("10.%d.%d.%d:80", round/250, round%250, i+1)
			lastRev = putInstance(t, ctx, st, r.Keyspace(), ins[i])
		}
	}
	if _, err := st.Delete(ctx, r.Keyspace().Key(ins[0].Ref())); err != nil {
		t.Fatal(err)
	}
	want, _, err := r.List(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	for !fv.Equal(want) {
		next(t, ctx, fast, fv)
	}
	b := next(t, ctx, slow, sv)
	if !sv.Equal(want) {
		t.Fatalf("slow consumer after one batch: %v", sv)
	}
	if len(b.Events) != n {
		t.Fatalf("slow consumer caught up with %d events, want %d (one per instance)", len(b.Events), n)
	}
	if b.Revision <= lastRev {
		t.Fatalf("batch revision %d, last write %d", b.Revision, lastRev)
	}
}

// TestInvalidValuesAreSkipped: values that are not instances (garbage, a
// key outside the layout, a value that disagrees with its key) are skipped
// by List and Watch and counted; an instance overwritten with garbage keeps
// its last valid value in watchers rather than vanishing.
func TestInvalidValuesAreSkipped(t *testing.T) {
	st := newMemoryStore(t)
	metrics := prometheus.NewPedanticRegistry()
	r := newRegistry(t, st, registry.Config{Metrics: metrics})
	ns := uniqueNS()
	ctx := within(t, 30*time.Second)
	ks := r.Keyspace()
	good := inst(ns, "10.0.0.1:80")
	good.ID = beacon.FormatID(1)
	good.RegisteredAt = time.Unix(1, 0).UTC()
	good.Status = beacon.StatusServing
	putInstance(t, ctx, st, ks, good)
	bad := map[string]string{
		ks.Key(beacon.Ref{Namespace: ns, Component: "api", Endpoint: "http", ID: beacon.FormatID(2)}): "not json",
		ks.Key(beacon.Ref{Namespace: ns, Component: "api", Endpoint: "http", ID: beacon.FormatID(3)}): `{"namespace":"x"}`,
		ks.Prefix(beacon.Query{Namespace: ns}) + "api/http/not-an-id":                                 `{}`,
	}
	other := good
	other.ID = beacon.FormatID(9) // a valid instance stored under another ID's key
	val, _ := json.Marshal(other)
	bad[ks.Key(beacon.Ref{Namespace: ns, Component: "api", Endpoint: "http", ID: beacon.FormatID(4)})] = string(val)
	for k, v := range bad {
		if _, err := st.Put(ctx, k, []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	q := beacon.Query{Namespace: ns}
	list, _, err := r.List(ctx, q)
	if err != nil || len(list) != 1 || !registrytest.Same(list[0], good) {
		t.Fatalf("List = %v, %v; want only the valid instance", list, err)
	}
	w, err := r.Watch(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	v := registrytest.NewView()
	next(t, ctx, w, v)
	if !v.Equal(list) {
		t.Fatalf("snapshot %v", v)
	}
	// Garbage over a valid instance: the watcher keeps the last valid one.
	if _, err := st.Put(ctx, ks.Key(good.Ref()), []byte("{broken")); err != nil {
		t.Fatal(err)
	}
	changed := good
	changed.Address = "10.0.0.2:80"
	putInstance(t, ctx, st, ks, changed)
	for {
		next(t, ctx, w, v)
		if in, _ := v.Get(good.Ref().String()); in.Address == changed.Address {
			break
		}
	}
	if v.Len() != 1 || v.Events != 2 {
		t.Fatalf("view %v after %d events, want the instance updated once", v, v.Events)
	}
	mfs, err := metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "beacon_registry_invalid_values_total" {
			if got := mf.GetMetric()[0].GetCounter().GetValue(); got < 5 {
				t.Fatalf("invalid values counted %v", got)
			}
			return
		}
	}
	t.Fatal("beacon_registry_invalid_values_total not registered")
}

// FuzzWatchConverges drives a registry with a random sequence of
// registrations, updates, deregistrations, drains, bursts and lease losses
// on a memory store with a tiny history (so the shared watch keeps falling
// behind compaction and re-listing), while one consumer reads continuously
// and one reads only at the end. Every batch must obey the event contract,
// and both consumers must converge to the listing.
func FuzzWatchConverges(f *testing.F) {
	f.Add([]byte{0, 0, 0, 1, 2, 3, 4, 5, 0, 1})
	f.Add([]byte{0, 0, 0, 0, 3, 3, 3, 5, 1, 1, 2, 2, 0})
	f.Add([]byte{0, 5, 0, 5, 0, 4, 1, 3, 2, 0, 0, 5})
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 3, 3, 3, 3, 3, 3, 2, 2, 2, 4, 4})
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 64 {
			ops = ops[:64]
		}
		st := memory.New(memory.Config{History: 8})
		defer st.Close()
		r, err := registry.New(st, registry.Config{LeaseTTL: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		ns := "fuzz"
		q := beacon.Query{Namespace: ns}
		fast, err := r.Watch(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		slow, err := r.Watch(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		fv, sv := registrytest.NewView(), registrytest.NewView()
		var (
			mu      sync.Mutex
			fastErr error
		)
		readDone := make(chan struct{})
		go func() {
			defer close(readDone)
			for {
				b, err := fast.Next(ctx)
				if err != nil {
					return
				}
				mu.Lock()
				if err := fv.Apply(b); err != nil && fastErr == nil {
					fastErr = err
				}
				mu.Unlock()
			}
		}()
		var regs []registry.Registration
		closed := map[registry.Registration]bool{}
		pick := func(b byte) registry.Registration {
			if len(regs) == 0 {
				return nil
			}
			return regs[int(b)%len(regs)]
		}
		for i, op := range ops {
			switch op % 6 {
			case 0:
				reg, err := r.Register(ctx, inst(ns, fmt.Sprintf("10.0.%d.%d:80", i, op)))
				if err != nil {
					t.Fatal(err)
				}
				regs = append(regs, reg)
			case 1:
				if reg := pick(op); reg != nil {
					_ = reg.Update(ctx, func(in *beacon.Instance) { in.Address = fmt.Sprintf("10.1.%d.%d:80", i, op) })
				}
			case 2:
				if reg := pick(op); reg != nil {
					_ = reg.Close()
					closed[reg] = true
				}
			case 3:
				for j := range 12 {
					if reg := pick(op + byte(j)); reg != nil {
						_ = reg.Update(ctx, func(in *beacon.Instance) { in.Metadata = map[string]string{"n": fmt.Sprint(i, j)} })
					}
				}
			case 4:
				if reg := pick(op); reg != nil {
					_ = reg.Drain(ctx)
					closed[reg] = true
				}
			case 5:
				if l := r.Lease(); l != store.NoLease {
					_ = st.Revoke(ctx, l)
				}
			}
		}
		live := len(regs) - len(closed)
		// Once the session settled (recovered, every registration
		// written), both consumers must reach the listing. The slow
		// consumer reads now, with a short deadline per batch, which also
		// paces the checks.
		deadline := time.Now().Add(20 * time.Second)
		for {
			want, _, err := r.List(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			fastOK, ferr := fv.Equal(want), fastErr
			mu.Unlock()
			if ferr != nil {
				t.Fatalf("fast consumer: %v", ferr)
			}
			settled := r.State() != registry.StateLost && len(want) == live
			if settled && fastOK && sv.Equal(want) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no convergence: list %d (live %d, state %v), fast %v, slow %v", len(want), live, r.State(), fv, sv)
			}
			nctx, ncancel := context.WithTimeout(ctx, 50*time.Millisecond)
			b, err := slow.Next(nctx)
			ncancel()
			if err == nil {
				if err := sv.Apply(b); err != nil {
					t.Fatalf("slow consumer: %v", err)
				}
			}
		}
		_ = fast.Close()
		_ = slow.Close()
		<-readDone
	})
}

// TestResyncKeepsInstanceOverwrittenWithGarbage: a value overwritten with
// garbage while a watcher is disconnected is not a removal after the
// re-list either (as it is not through a live watch): the watcher keeps
// the last valid instance, and a valid value written later is an update.
func TestResyncKeepsInstanceOverwrittenWithGarbage(t *testing.T) {
	t.Parallel()
	proxy, watching := cutRegistry(t, server)
	ctx := within(t, 60*time.Second)
	ns := uniqueNS()
	q := beacon.Query{Namespace: ns}
	direct := newEtcdStore(t, nil, etcd.Config{})
	ks := watching.Keyspace()
	good := inst(ns, "10.0.0.1:80")
	good.ID = beacon.FormatID(1)
	good.RegisteredAt = time.Unix(1, 0).UTC()
	good.Status = beacon.StatusServing
	putInstance(t, ctx, direct, ks, good)

	w, err := watching.Watch(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	v := registrytest.NewView()
	if b := next(t, ctx, w, v); b.Kind != registry.Snapshot || v.Len() != 1 {
		t.Fatalf("first batch %v, view %v", b.Kind, v)
	}

	proxy.Cut()
	for next(t, ctx, w, v).Kind != registry.Stale {
	}
	if _, err := direct.Put(ctx, ks.Key(good.Ref()), []byte("{broken")); err != nil {
		t.Fatal(err)
	}
	proxy.Restore()
	for {
		b := next(t, ctx, w, v)
		for _, e := range b.Events {
			t.Fatalf("event after re-listing a key that holds garbage: %v %s", e.Type, e.Instance.Ref())
		}
		if b.Kind == registry.Resync {
			break
		}
	}
	if in, ok := v.Get(good.Ref().String()); !ok || !registrytest.Same(in, good) {
		t.Fatalf("view after the resync: %v", v)
	}

	changed := good
	changed.Address = "10.0.0.2:80"
	putInstance(t, ctx, direct, ks, changed)
	b := next(t, ctx, w, v)
	if len(b.Events) != 1 || b.Events[0].Type != beacon.Updated || b.Events[0].Instance.Address != changed.Address {
		t.Fatalf("after a valid value: %v %+v", b.Kind, b.Events)
	}
}

// TestLingeringFeedsBounded: a client that opens and closes watches of
// ever new prefixes, one at a time (no cap on open watches stops it),
// leaves at most a bounded number of store watches lingering — over real
// etcd, 200 prefixes once left 200 etcd watches open for the linger period.
func TestLingeringFeedsBounded(t *testing.T) {
	r := newRegistry(t, newEtcdStore(t, nil, etcd.Config{}), registry.Config{WatchLinger: time.Minute})
	ctx := within(t, 60*time.Second)
	ns := uniqueNS()
	for i := range 200 {
		w, err := r.Watch(ctx, beacon.Query{Namespace: ns, Component: fmt.Sprintf("c%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		next(t, ctx, w, registrytest.NewView())
		_ = w.Close()
	}
	if n := r.WatchStreams(); n > 64 {
		t.Fatalf("%d store watches linger after 200 watches opened and closed one at a time, want at most 64", n)
	}
	// The most recent ones linger (a reconnecting client finds its feed).
	w, err := r.Watch(ctx, beacon.Query{Namespace: ns, Component: "c199"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if n := r.WatchStreams(); n > 64 {
		t.Fatalf("reopening a lingering watch added a feed: %d", n)
	}
}
