package mvcc_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/internal/mvcc"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// wait bounds every wait for a watch in these tests.
const wait = 20 * time.Second

func newStore(t *testing.T, m *model, history int64) *mvcc.Store {
	t.Helper()
	s := mvcc.New(mvcc.Config{History: history, LeaseAlive: m.leaseAlive})
	t.Cleanup(s.Close)
	return s
}

// setup returns a Store and its model, with n writes of key done.
func setup(t *testing.T, history int64, n int, key string) (context.Context, *model, *mvcc.Store) {
	t.Helper()
	ctx := context.Background()
	m := newModel()
	s := newStore(t, m, history)
	for range n {
		both(t, ctx, m, s, op{kind: "put", key: key})
	}
	return ctx, m, s
}

// closes reads w until it closes, failing on an error or the deadline.
func closes(t *testing.T, w store.WatchChan) {
	t.Helper()
	deadline := time.After(wait)
	for {
		select {
		case resp, ok := <-w:
			if !ok {
				return
			}
			if resp.Err != nil {
				t.Fatalf("the watch ended with %v", resp.Err)
			}
		case <-deadline:
			t.Fatal("the watch did not close")
		}
	}
}

// change is the Change of a model op.
func change(o op) mvcc.Change {
	var opts []store.WriteOption
	if o.lease != store.NoLease {
		opts = append(opts, store.WithLease(o.lease))
	}
	if o.keepLease {
		opts = append(opts, store.KeepLease())
	}
	switch o.kind {
	case "create":
		return mvcc.Create(o.key, []byte(o.value), opts)
	case "put":
		return mvcc.Put(o.key, []byte(o.value), opts)
	case "update":
		return mvcc.Update(o.key, []byte(o.value), o.rev, opts)
	case "delete":
		var dopts []store.DeleteOption
		if o.rev != 0 {
			dopts = append(dopts, store.IfModRevision(o.rev))
		}
		return mvcc.Delete(o.key, dopts)
	case "txn":
		return mvcc.Txn(o.ops)
	case "endlease":
		return mvcc.EndLease(o.lease)
	}
	panic("unknown op " + o.kind)
}

// both applies o to the model and the Store and fails unless they agree
// on the outcome and the revision.
func both(t *testing.T, ctx context.Context, m *model, s *mvcc.Store, o op) {
	t.Helper()
	want := m.apply(o)
	rev, err := s.Commit(ctx, change(o))
	var ce *store.ConflictError
	switch {
	case want == nil && err != nil:
		t.Fatalf("%+v: %v, want success", o, err)
	case want != nil && !errors.Is(err, want):
		t.Fatalf("%+v: %v, want %v", o, err, want)
	case errors.As(err, &ce) && (o.kind != "txn" || !errors.Is(ce.Err, want)):
		t.Fatalf("%+v: %v, want a conflict of %v in a transaction only", o, err, want)
	case o.kind == "txn" && want != nil && !errors.Is(want, errLease) && ce == nil:
		t.Fatalf("%+v: %v is not a *store.ConflictError", o, err)
	case want == nil && rev != m.rev:
		t.Fatalf("%+v: revision %d, want %d", o, rev, m.rev)
	}
	if _, cur := s.Revisions(); cur != m.rev {
		t.Fatalf("%+v: current revision %d, want %d", o, cur, m.rev)
	}
}

func sameState(t *testing.T, ctx context.Context, m *model, s *mvcc.Store) {
	t.Helper()
	kvs, rev, err := s.List(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if want := m.list(""); rev != m.rev || !reflect.DeepEqual(kvs, want) {
		t.Fatalf("state at %d:\n%v\nwant at %d:\n%v", rev, kvs, m.rev, want)
	}
}

// responses reads w until it has delivered n events; it fails on an error,
// a closed channel, more events than n, or the deadline.
func responses(t *testing.T, w store.WatchChan, n int) [][]store.Event {
	t.Helper()
	var out [][]store.Event
	got := 0
	deadline := time.After(wait)
	for got < n {
		select {
		case resp, ok := <-w:
			if !ok || resp.Err != nil {
				t.Fatalf("watch ended after %d of %d events: %v", got, n, resp.Err)
			}
			if len(resp.Events) == 0 {
				t.Fatalf("a response with neither events nor an error, after %d events", got)
			}
			out = append(out, resp.Events)
			got += len(resp.Events)
		case <-deadline:
			t.Fatalf("watch delivered %d of %d events", got, n)
		}
	}
	if got > n {
		t.Fatalf("watch delivered %d events, want %d", got, n)
	}
	return out
}

func flatten(rs [][]store.Event) []store.Event {
	var out []store.Event
	for _, r := range rs {
		out = append(out, r...)
	}
	return out
}

// quiet fails if w delivers anything before the Store's next change: it
// writes a marker under prefix and expects exactly its event.
func quiet(t *testing.T, ctx context.Context, m *model, s *mvcc.Store, w store.WatchChan, prefix string) {
	t.Helper()
	both(t, ctx, m, s, op{kind: "put", key: prefix + "marker"})
	evs := flatten(responses(t, w, 1))
	if evs[0].KV.Key != prefix+"marker" {
		t.Fatalf("unexpected event %+v before the marker", evs[0])
	}
}

func randomOp(r *rand.Rand, m *model) op {
	keys := []string{"a/1", "a/2", "a/3", "b/1", "b/2", "c"}
	leases := []store.LeaseID{store.NoLease, 1, 2, 3} // 3 is not alive
	key := keys[r.IntN(len(keys))]
	o := op{key: key, value: fmt.Sprint(r.IntN(1000)), lease: leases[r.IntN(len(leases))]}
	cur := m.kvs[key].ModRevision
	if r.IntN(4) == 0 {
		cur = r.Int64N(m.rev + 1) // mostly stale
	}
	switch n := r.IntN(10); {
	case n < 1:
		o.kind = "create"
	case n < 4:
		o.kind, o.keepLease = "put", r.IntN(5) == 0
	case n < 6:
		o.kind, o.rev = "update", cur
	case n < 7:
		o.kind, o.rev = "delete", cur*int64(r.IntN(2))
	case n < 9:
		o.kind = "txn"
		for _, i := range r.Perm(len(keys))[:1+r.IntN(3)] {
			x := store.Op{Kind: store.OpPut, Key: keys[i], Value: []byte(o.value), Lease: leases[r.IntN(len(leases))]}
			if r.IntN(3) == 0 {
				x.Kind = store.OpDelete
			}
			switch r.IntN(4) {
			case 0:
				x.IfAbsent = true
			case 1:
				x.IfModRevision = m.kvs[keys[i]].ModRevision
			}
			o.ops = append(o.ops, x)
		}
	default:
		o.kind, o.lease = "endlease", leases[r.IntN(len(leases))] // NoLease too: no keys
	}
	return o
}

// TestRandomChangesMatchTheModel pins the checks and the state: every
// outcome, revision and key of a long random run equal the model's, and the
// log replayed by watches from every revision is the model's history.
func TestRandomChangesMatchTheModel(t *testing.T) {
	ctx, m, s := setup(t, 0, 0, "")
	m.alive[1], m.alive[2] = true, true
	r := rand.New(rand.NewPCG(1, 2))
	for range 3000 {
		both(t, ctx, m, s, randomOp(r, m))
		sameState(t, ctx, m, s)
	}
	for _, prefix := range []string{"", "a/", "b/1"} {
		for from := int64(1); from <= m.rev; from += 1 + r.Int64N(300) {
			want := m.since(prefix, from)
			w := s.Watch(ctx, prefix, from)
			if got := flatten(responses(t, w, len(want))); !reflect.DeepEqual(got, want) {
				t.Fatalf("watch %q from %d:\n%v\nwant\n%v", prefix, from, got, want)
			}
		}
	}
}

// TestEveryChangeTakesOneRevision: an applied change raises the revision by
// exactly one; a refused one, and one that changes nothing, take none.
func TestEveryChangeTakesOneRevision(t *testing.T) {
	ctx, m, s := setup(t, 0, 0, "")
	for i, c := range []struct {
		o    op
		want int64
	}{
		{op{kind: "create", key: "k"}, 2},
		{op{kind: "create", key: "k"}, 2}, // refused
		{op{kind: "put", key: "k"}, 3},
		{op{kind: "txn", ops: []store.Op{{Kind: store.OpDelete, Key: "absent"}}}, 3}, // nothing
		{op{kind: "txn", ops: []store.Op{{Kind: store.OpPut, Key: "x"}, {Kind: store.OpPut, Key: "y"}}}, 4},
		{op{kind: "endlease", lease: 9}, 4}, // no keys
		{op{kind: "delete", key: "k"}, 5},
	} {
		rev, err := s.Commit(ctx, change(c.o))
		m.apply(c.o)
		if _, cur := s.Revisions(); cur != c.want || (err == nil && rev != c.want) {
			t.Fatalf("change %d (%+v): returned %d (%v), current %d, want %d", i, c.o, rev, err, cur, c.want)
		}
	}
}

// TestChecks pins each precondition, with the sentinel it fails with and
// the state it needs.
func TestChecks(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name string
		o    op
		want error
	}{
		{"create of an existing key", op{kind: "create", key: "k"}, store.ErrKeyExists},
		{"create of an absent key", op{kind: "create", key: "new"}, nil},
		{"update at the key's revision", op{kind: "update", key: "k", rev: 2}, nil},
		{"update at another revision", op{kind: "update", key: "k", rev: 3}, store.ErrConflict},
		{"update of an absent key", op{kind: "update", key: "new", rev: 2}, store.ErrNotFound},
		{"delete of an absent key", op{kind: "delete", key: "new"}, store.ErrNotFound},
		{"delete if unchanged", op{kind: "delete", key: "k", rev: 2}, nil},
		{"delete if unchanged, changed", op{kind: "delete", key: "k", rev: 1}, store.ErrConflict},
		{"put with a live lease", op{kind: "put", key: "k", lease: 1}, nil},
		{"put with a dead lease", op{kind: "put", key: "k", lease: 7}, errLease},
		{"keep the lease of an absent key", op{kind: "put", key: "new", keepLease: true}, store.ErrNotFound},
		{"keep a dead lease", op{kind: "put", key: "dead", keepLease: true}, errLease},
		{"keep no lease", op{kind: "put", key: "k", keepLease: true, lease: 7}, nil},
		{"txn: first failure wins", op{kind: "txn", ops: []store.Op{
			{Kind: store.OpPut, Key: "new", IfModRevision: 5}, {Kind: store.OpPut, Key: "k", IfAbsent: true}}}, store.ErrNotFound},
		{"txn: dead lease", op{kind: "txn", ops: []store.Op{{Kind: store.OpPut, Key: "new", Lease: 7}}}, errLease},
		{"txn: dead lease on a delete is ignored", op{kind: "txn", ops: []store.Op{{Kind: store.OpDelete, Key: "k", Lease: 7}}}, nil},
		{"txn: stale revision", op{kind: "txn", ops: []store.Op{{Kind: store.OpDelete, Key: "k", IfModRevision: 1}}}, store.ErrConflict},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := newModel()
			m.alive[1], m.alive[7] = true, true
			s := newStore(t, m, 0)
			both(t, ctx, m, s, op{kind: "put", key: "k"})              // revision 2
			both(t, ctx, m, s, op{kind: "put", key: "dead", lease: 7}) // revision 3
			m.alive[7] = false
			if got := m.apply(c.o); !errors.Is(got, c.want) {
				t.Fatalf("the model says %v, the table %v", got, c.want)
			}
			_, err := s.Commit(ctx, change(c.o))
			if !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
				t.Fatalf("%v, want %v", err, c.want)
			}
			sameState(t, ctx, m, s)
		})
	}
}

func TestTxnConflictNamesTheKey(t *testing.T) {
	ctx, m, s := setup(t, 0, 0, "")
	both(t, ctx, m, s, op{kind: "put", key: "a"})
	_, err := s.Commit(ctx, mvcc.Txn([]store.Op{
		{Kind: store.OpPut, Key: "b"},
		{Kind: store.OpPut, Key: "a", IfAbsent: true},
		{Kind: store.OpPut, Key: "c", IfAbsent: true},
	}))
	var ce *store.ConflictError
	if !errors.As(err, &ce) || ce.Key != "a" || !errors.Is(err, store.ErrKeyExists) || !errors.Is(err, store.ErrConflict) {
		t.Fatalf("conflict: %v", err)
	}
	_, err = s.Commit(ctx, mvcc.Txn([]store.Op{{Kind: store.OpPut, Key: "b", Lease: 5}}))
	if !errors.Is(err, errLease) || !strings.Contains(err.Error(), `(for "b")`) {
		t.Fatalf("dead lease in a transaction: %v", err)
	}
	sameState(t, ctx, m, s)
}

func TestInvalidChangesAreRefusedFirst(t *testing.T) {
	m := newModel()
	s := newStore(t, m, 0)
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the arguments are checked before the context
	for name, c := range map[string]mvcc.Change{
		"empty key":       mvcc.Put("", nil, nil),
		"value too large": mvcc.Create("k", make([]byte, store.MaxValueSize+1), nil),
		"bad delete key":  mvcc.Delete("\xff", nil),
		"empty txn":       mvcc.Txn(nil),
	} {
		if _, err := s.Commit(ctx, c); err == nil || errors.Is(err, context.Canceled) || c.Err() == nil {
			t.Errorf("%s: %v", name, err)
		}
		if _, err := s.Prepare(c); err == nil || !errors.Is(err, c.Err()) {
			t.Errorf("Prepare, %s: %v", name, err)
		}
	}
	if _, err := s.Commit(ctx, mvcc.Put("k", nil, nil)); !errors.Is(err, context.Canceled) {
		t.Fatalf("Commit with a cancelled context: %v", err)
	}
	if _, err := s.Get(ctx, "k"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Get with a cancelled context: %v", err)
	}
}

func TestCheckOfANonSingleKeyChange(t *testing.T) {
	for _, c := range []mvcc.Change{mvcc.Txn([]store.Op{{Kind: store.OpPut, Key: "k"}}), mvcc.EndLease(1)} {
		if _, err := c.Check(nil); err == nil {
			t.Errorf("Check of %+v accepted", c)
		}
	}
	if id, err := mvcc.Delete("k", nil).Check(&store.KeyValue{Key: "k", Lease: 4}); err != nil || id != store.NoLease {
		t.Fatalf("Check of a delete: %v, %v", id, err)
	}
}

// TestValuesAreCopied: neither the caller's slice after a write nor a
// value read or watched aliases the Store's.
func TestValuesAreCopied(t *testing.T) {
	ctx := context.Background()
	s := mvcc.New(mvcc.Config{})
	defer s.Close()
	v := []byte("abc")
	if _, err := s.Commit(ctx, mvcc.Put("k", v, nil)); err != nil {
		t.Fatal(err)
	}
	v[0] = 'X'
	kv, _ := s.Get(ctx, "k")
	kv.Value[1] = 'Y'
	kvs, _, _ := s.List(ctx, "")
	kvs[0].Value[2] = 'Z'
	resp := <-s.Watch(ctx, "", 1)
	resp.Events[0].KV.Value[0] = 'W'
	if kv, _ := s.Get(ctx, "k"); string(kv.Value) != "abc" {
		t.Fatalf("value changed to %q", kv.Value)
	}
	if resp := <-s.Watch(ctx, "", 1); string(resp.Events[0].KV.Value) != "abc" {
		t.Fatalf("logged value changed to %q", resp.Events[0].KV.Value)
	}
	if _, err := s.Commit(ctx, mvcc.Put("empty", nil, nil)); err != nil {
		t.Fatal(err)
	}
	if kv, _ := s.Get(ctx, "empty"); kv.Value == nil {
		t.Fatal("an empty value reads as nil")
	}
}

func TestGetAbsent(t *testing.T) {
	s := mvcc.New(mvcc.Config{})
	defer s.Close()
	if _, err := s.Get(context.Background(), "nope"); !errors.Is(err, store.ErrNotFound) {
		t.Fatal(err)
	}
	if _, err := s.Get(context.Background(), ""); !errors.Is(err, store.ErrInvalidKey) {
		t.Fatal(err)
	}
	if _, _, err := s.List(context.Background(), "\xff"); !errors.Is(err, store.ErrInvalidKey) {
		t.Fatal(err)
	}
}

// TestListIsPrefixAndSnapshot: List returns exactly the keys under the
// prefix, in order, with the revision of the state it read.
func TestListIsPrefixAndSnapshot(t *testing.T) {
	ctx, m, s := setup(t, 0, 0, "")
	for _, k := range []string{"a", "a/1", "a/2", "ab", "b", "a/0"} {
		both(t, ctx, m, s, op{kind: "put", key: k})
	}
	for _, p := range []string{"", "a", "a/", "a/1", "c", "0"} {
		kvs, rev, err := s.List(ctx, p)
		if err != nil || rev != m.rev || !reflect.DeepEqual(kvs, m.list(p)) {
			t.Fatalf("List(%q): %v at %d (%v), want %v at %d", p, kvs, rev, err, m.list(p), m.rev)
		}
	}
}

// TestWatchOrderedExactlyOnce: watchers of several prefixes, started at
// several revisions while a writer runs, each get exactly the model's
// events from their start, in order, each revision in one response.
func TestWatchOrderedExactlyOnce(t *testing.T) {
	ctx, m, s := setup(t, 0, 0, "")
	m.alive[1], m.alive[2] = true, true
	r := rand.New(rand.NewPCG(3, 4))
	type watch struct {
		prefix string
		from   int64
		w      store.WatchChan
	}
	var ws []watch
	for i := range 2000 {
		if i%100 == 0 {
			for _, p := range []string{"", "a/", "b/"} {
				from := m.rev + 1
				if i%200 == 0 {
					from = max(1, m.rev-int64(r.IntN(50)))
				}
				ws = append(ws, watch{p, from, s.Watch(ctx, p, from)})
			}
		}
		both(t, ctx, m, s, randomOp(r, m))
	}
	for _, w := range ws {
		want := m.since(w.prefix, w.from)
		rs := responses(t, w.w, len(want))
		if got := flatten(rs); !reflect.DeepEqual(got, want) {
			t.Fatalf("watch %q from %d: %d events differ from the model's %d", w.prefix, w.from, len(got), len(want))
		}
		seen := map[int64]bool{}
		for _, r := range rs {
			for i, e := range r {
				if seen[e.Revision()] && (i == 0 || r[i-1].Revision() != e.Revision()) {
					t.Fatalf("watch %q from %d: revision %d split across responses", w.prefix, w.from, e.Revision())
				}
				seen[e.Revision()] = true
			}
		}
	}
}

// TestWatchFromZeroStartsAfterTheCurrentRevision.
func TestWatchFromZeroStartsAfterTheCurrentRevision(t *testing.T) {
	ctx, m, s := setup(t, 0, 0, "")
	both(t, ctx, m, s, op{kind: "put", key: "k", value: "old"})
	w := s.Watch(ctx, "", 0)
	both(t, ctx, m, s, op{kind: "put", key: "k", value: "new"})
	evs := flatten(responses(t, w, 1))
	if string(evs[0].KV.Value) != "new" || evs[0].Revision() != m.rev {
		t.Fatalf("watch from now: %+v", evs)
	}
}

// TestWatchResumesFromEveryRevision: a watch from any revision in the log
// delivers exactly the events from it on, also from the next revision
// (nothing yet, then the next write).
func TestWatchResumesFromEveryRevision(t *testing.T) {
	ctx, m, s := setup(t, 0, 0, "")
	for i := range 20 {
		both(t, ctx, m, s, op{kind: "put", key: fmt.Sprintf("k%d", i%3)})
	}
	for from := int64(1); from <= m.rev; from++ {
		want := m.since("", from)
		if got := flatten(responses(t, s.Watch(ctx, "", from), len(want))); !reflect.DeepEqual(got, want) {
			t.Fatalf("from %d: %v, want %v", from, got, want)
		}
	}
	w := s.Watch(ctx, "", m.rev+1)
	quiet(t, ctx, m, s, w, "")
}

// TestWatchCompacted: a watch from below the watermark ends with a
// *store.CompactedError naming both revisions, then closes; from the
// watermark it works.
func TestWatchCompacted(t *testing.T) {
	ctx, m, s := setup(t, 0, 10, "k")
	if err := s.Compact(ctx, 7); err != nil {
		t.Fatal(err)
	}
	if c, _ := s.Revisions(); c != 7 {
		t.Fatalf("watermark %d after Compact(7)", c)
	}
	w := s.Watch(ctx, "", 6)
	resp := <-w
	var ce *store.CompactedError
	if !errors.As(resp.Err, &ce) || ce.Requested != 6 || ce.CompactRevision != 7 {
		t.Fatalf("watch from 6 after Compact(7): %+v", resp)
	}
	if _, ok := <-w; ok {
		t.Fatal("the channel stayed open after the compaction error")
	}
	want := m.since("", 7)
	if got := flatten(responses(t, s.Watch(ctx, "", 7), len(want))); !reflect.DeepEqual(got, want) {
		t.Fatalf("from the watermark: %v", got)
	}
	sameState(t, ctx, m, s)
}

// TestCompactRefusesBadRevisions: the future is an error that is not a
// compaction; the watermark or below is a *store.CompactedError.
func TestCompactRefusesBadRevisions(t *testing.T) {
	ctx, m, s := setup(t, 0, 5, "k")
	if err := s.Compact(ctx, m.rev+1); err == nil || errors.Is(err, store.ErrCompacted) {
		t.Fatalf("Compact past the current revision: %v", err)
	}
	if err := s.Compact(ctx, m.rev); err != nil {
		t.Fatalf("Compact to the current revision: %v", err)
	}
	for _, rev := range []int64{m.rev, m.rev - 1} {
		var ce *store.CompactedError
		if err := s.Compact(ctx, rev); !errors.As(err, &ce) || ce.CompactRevision != m.rev || ce.Requested != rev {
			t.Fatalf("Compact(%d) at watermark %d: %v", rev, m.rev, err)
		}
		if err := s.CheckCompact(rev); !errors.Is(err, store.ErrCompacted) {
			t.Fatalf("CheckCompact(%d): %v", rev, err)
		}
	}
	if err := s.CheckCompact(m.rev + 1); err == nil {
		t.Fatal("CheckCompact past the current revision passed")
	}
}

// TestHistoryWindow: with a window of H revisions, each commit compacts
// what falls out of it, and only that.
func TestHistoryWindow(t *testing.T) {
	ctx, m, s := setup(t, 10, 0, "")
	for i := range 30 {
		both(t, ctx, m, s, op{kind: "put", key: "k"})
		if c, cur := s.Revisions(); c != max(1, cur-9) {
			t.Fatalf("after write %d: watermark %d at revision %d, want %d", i, c, cur, max(1, cur-9))
		}
	}
	want := m.since("", m.rev-9)
	if got := flatten(responses(t, s.Watch(ctx, "", m.rev-9), len(want))); !reflect.DeepEqual(got, want) {
		t.Fatalf("inside the window: %v", got)
	}
	if resp := <-s.Watch(ctx, "", m.rev-10); !errors.Is(resp.Err, store.ErrCompacted) {
		t.Fatalf("below the window: %+v", resp)
	}
}

// TestSlowWatcherNeverBlocksTheWriter: a watcher nobody reads holds up no
// write, and once read it delivers every event, in order.
func TestSlowWatcherNeverBlocksTheWriter(t *testing.T) {
	ctx, _, s := setup(t, 0, 0, "")
	slow := s.Watch(ctx, "", 1)
	const n = 5000
	done := make(chan error, 1)
	go func() {
		for i := range n {
			if _, err := s.Commit(ctx, mvcc.Put(fmt.Sprintf("k%d", i%10), []byte("v"), nil)); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(wait):
		t.Fatal("the writer is blocked by a watcher nobody reads")
	}
	evs := flatten(responses(t, slow, n))
	for i, e := range evs {
		if e.Revision() != int64(i)+2 || e.KV.Key != fmt.Sprintf("k%d", i%10) {
			t.Fatalf("event %d: %+v", i, e)
		}
	}
}

// TestSlowWatcherBehindTheWindowEnds: a watcher that falls behind the
// window gets what it had, in order, then a *store.CompactedError asking
// for the next revision it needed.
func TestSlowWatcherBehindTheWindowEnds(t *testing.T) {
	ctx, m, s := setup(t, 10, 0, "")
	slow := s.Watch(ctx, "", 1)
	for range 3 * mvcc.MaxBatch {
		both(t, ctx, m, s, op{kind: "put", key: "k"})
	}
	next := int64(1)
	deadline := time.After(wait)
	for {
		select {
		case resp, ok := <-slow:
			if !ok {
				t.Fatal("closed without an error")
			}
			for _, e := range resp.Events {
				if e.Revision() < next {
					t.Fatalf("revision %d after %d", e.Revision(), next-1)
				}
				next = e.Revision() + 1
			}
			if resp.Err == nil {
				continue
			}
			var ce *store.CompactedError
			if !errors.As(resp.Err, &ce) || ce.Requested != next || ce.CompactRevision <= next {
				t.Fatalf("error %v after revision %d", resp.Err, next-1)
			}
			return
		case <-deadline:
			t.Fatal("no compaction error")
		}
	}
}

// TestBatchesNeverSplitARevision: a backlog goes out MaxBatch events at a
// time; a revision larger than that goes out whole, in one response.
func TestBatchesNeverSplitARevision(t *testing.T) {
	ctx, m, s := setup(t, 0, 0, "")
	for i := range mvcc.MaxBatch + 10 {
		both(t, ctx, m, s, op{kind: "put", key: fmt.Sprintf("k%d", i)})
	}
	var big []store.Op
	for i := range mvcc.MaxBatch + 5 {
		big = append(big, store.Op{Kind: store.OpPut, Key: fmt.Sprintf("t%d", i)})
	}
	both(t, ctx, m, s, op{kind: "txn", ops: big})
	rs := responses(t, s.Watch(ctx, "", 1), len(m.events))
	sizes := []int{}
	for _, r := range rs {
		sizes = append(sizes, len(r))
	}
	if want := []int{mvcc.MaxBatch, 10 + mvcc.MaxBatch + 5}; !reflect.DeepEqual(sizes, want) {
		t.Fatalf("response sizes %v, want %v", sizes, want)
	}
}

// TestEndLeaseDeletesAllKeysAtOneRevision: ending a lease deletes every
// key bound to it, sorted, at one revision delivered in one response, and
// no other key; a lease without keys takes no revision.
func TestEndLeaseDeletesAllKeysAtOneRevision(t *testing.T) {
	ctx, m, s := setup(t, 0, 0, "")
	m.alive[1], m.alive[2] = true, true
	for _, k := range []string{"c", "a", "b"} {
		both(t, ctx, m, s, op{kind: "put", key: k, lease: 1})
	}
	both(t, ctx, m, s, op{kind: "put", key: "d", lease: 2})
	both(t, ctx, m, s, op{kind: "put", key: "e"})
	w := s.Watch(ctx, "", m.rev+1)
	both(t, ctx, m, s, op{kind: "endlease", lease: 1})
	rs := responses(t, w, 3)
	if len(rs) != 1 {
		t.Fatalf("the lease's deletions came in %d responses", len(rs))
	}
	for i, k := range []string{"a", "b", "c"} {
		if e := rs[0][i]; e.Type != store.EventDelete || e.KV.Key != k || e.Revision() != m.rev {
			t.Fatalf("deletion %d: %+v, want %q at %d", i, e, k, m.rev)
		}
	}
	sameState(t, ctx, m, s)
	before := m.rev
	both(t, ctx, m, s, op{kind: "endlease", lease: 1})
	if m.rev != before {
		t.Fatal("ending a lease without keys took a revision")
	}
	quiet(t, ctx, m, s, w, "")
}

// TestLeaseBookkeepingFollowsEveryWrite: a key is bound to the lease of
// its last write only; a delete, a put without a lease or with another
// lease, a transaction and a snapshot all keep the lease → keys map right.
func TestLeaseBookkeepingFollowsEveryWrite(t *testing.T) {
	ctx, m, s := setup(t, 0, 0, "")
	m.alive[1], m.alive[2] = true, true
	leases := func() map[store.LeaseID]bool {
		got := map[store.LeaseID]bool{}
		s.ForEachLease(func(id store.LeaseID) { got[id] = true })
		for _, id := range []store.LeaseID{1, 2, 3} {
			if s.HasKeys(id) != got[id] {
				t.Fatalf("HasKeys(%d) = %v, ForEachLease says %v", id, s.HasKeys(id), got[id])
			}
		}
		return got
	}
	both(t, ctx, m, s, op{kind: "put", key: "a", lease: 1})
	both(t, ctx, m, s, op{kind: "put", key: "a", lease: 1}) // same lease again
	both(t, ctx, m, s, op{kind: "put", key: "b", lease: 1})
	both(t, ctx, m, s, op{kind: "put", key: "a", lease: 2}) // moves
	both(t, ctx, m, s, op{kind: "put", key: "b"})           // unbinds
	if got := leases(); !reflect.DeepEqual(got, map[store.LeaseID]bool{2: true}) {
		t.Fatalf("leases with keys: %v", got)
	}
	both(t, ctx, m, s, op{kind: "endlease", lease: 1}) // nothing left on it
	both(t, ctx, m, s, op{kind: "txn", ops: []store.Op{{Kind: store.OpPut, Key: "c", Lease: 1}, {Kind: store.OpDelete, Key: "a"}}})
	if got := leases(); !reflect.DeepEqual(got, map[store.LeaseID]bool{1: true}) {
		t.Fatalf("leases with keys after the transaction: %v", got)
	}
	_, _, kvs := s.Snapshot()
	s.Install(m.rev, m.rev+1, append(kvs, store.KeyValue{Key: "z", Value: []byte{}, CreateRevision: 2, ModRevision: 2, Lease: 3}))
	if got := leases(); !reflect.DeepEqual(got, map[store.LeaseID]bool{1: true, 3: true}) {
		t.Fatalf("leases with keys after Install: %v", got)
	}
	m.kvs["z"] = store.KeyValue{Key: "z", Value: []byte{}, CreateRevision: 2, ModRevision: 2, Lease: 3}
	both(t, ctx, m, s, op{kind: "endlease", lease: 3})
	both(t, ctx, m, s, op{kind: "delete", key: "c"})
	if got := leases(); len(got) != 0 {
		t.Fatalf("leases with keys at the end: %v", got)
	}
	sameState(t, ctx, m, s)
}

// TestPrepareThenApply: Prepare changes nothing; Apply of its batch does
// what Commit does; a batch with no events names the current revision.
func TestPrepareThenApply(t *testing.T) {
	ctx, m, s := setup(t, 0, 0, "")
	both(t, ctx, m, s, op{kind: "put", key: "a"})
	w := s.Watch(ctx, "", m.rev+1)
	b, err := s.Prepare(mvcc.Put("b", []byte("v"), nil))
	if err != nil || b.Rev != m.rev+1 || len(b.Events) != 1 {
		t.Fatalf("Prepare: %+v, %v", b, err)
	}
	sameState(t, ctx, m, s) // nothing applied yet
	if err := s.Apply(b.Rev, b.Events); err != nil {
		t.Fatal(err)
	}
	m.apply(op{kind: "put", key: "b", value: "v"})
	sameState(t, ctx, m, s)
	if evs := flatten(responses(t, w, 1)); !reflect.DeepEqual(evs, m.since("", m.rev)) {
		t.Fatalf("applied batch watched as %v", evs)
	}
	if b, err := s.Prepare(mvcc.Txn([]store.Op{{Kind: store.OpDelete, Key: "absent"}})); err != nil || b.Rev != m.rev || len(b.Events) != 0 {
		t.Fatalf("Prepare of nothing: %+v, %v", b, err)
	}
	if _, err := s.Prepare(mvcc.Create("a", nil, nil)); !errors.Is(err, store.ErrKeyExists) {
		t.Fatalf("Prepare of a refused change: %v", err)
	}
}

// TestApplyReplaysHistoryAndRefusesGaps: a revision the state holds only
// extends the history (not below the watermark); a gap is an error and
// changes nothing.
func TestApplyReplaysHistoryAndRefusesGaps(t *testing.T) {
	ctx := context.Background()
	s := mvcc.New(mvcc.Config{})
	defer s.Close()
	kv := func(k string, rev int64) store.KeyValue {
		return store.KeyValue{Key: k, Value: []byte(k), CreateRevision: rev, ModRevision: rev}
	}
	// A snapshot at 5 (compacted to 3) and a log holding 2..7.
	s.Install(5, 3, []store.KeyValue{kv("x", 4), kv("y", 5)})
	for rev := int64(2); rev <= 7; rev++ {
		k := map[int64]string{2: "w", 3: "v", 4: "x", 5: "y", 6: "z", 7: "x"}[rev]
		if err := s.Apply(rev, []store.Event{{Type: store.EventPut, KV: kv(k, rev)}}); err != nil {
			t.Fatalf("Apply(%d): %v", rev, err)
		}
	}
	if err := s.Apply(9, []store.Event{{Type: store.EventPut, KV: kv("gap", 9)}}); err == nil || !strings.Contains(err.Error(), "revision 9 follows revision 7") {
		t.Fatalf("Apply over a gap: %v", err)
	}
	kvs, rev, _ := s.List(ctx, "")
	if rev != 7 || len(kvs) != 3 || kvs[0].Key != "x" || kvs[0].ModRevision != 7 || kvs[2].Key != "z" {
		t.Fatalf("state: %v at %d", kvs, rev)
	}
	rs := flatten(responses(t, s.Watch(ctx, "", 3), 5))
	for i, e := range rs {
		if e.Revision() != int64(i)+3 {
			t.Fatalf("history: %v", rs)
		}
	}
}

// TestInstallReplacesEverything: keys, revision, watermark and history go;
// a watcher behind the new watermark ends; one at it goes on.
func TestInstallReplacesEverything(t *testing.T) {
	ctx, m, s := setup(t, 0, 5, "old")
	m.alive[1] = true
	both(t, ctx, m, s, op{kind: "put", key: "leased", lease: 1})
	behind := s.Watch(ctx, "", m.rev+1)
	s.Install(20, 21, []store.KeyValue{{Key: "new", Value: []byte("v"), CreateRevision: 19, ModRevision: 20}})
	if s.HasKeys(1) {
		t.Fatal("a key of the old state is still bound to its lease")
	}
	resp := <-behind
	var ce *store.CompactedError
	if !errors.As(resp.Err, &ce) || ce.Requested != m.rev+1 || ce.CompactRevision != 21 {
		t.Fatalf("watcher behind the snapshot: %+v", resp)
	}
	kvs, rev, _ := s.List(ctx, "")
	if rev != 20 || len(kvs) != 1 || kvs[0].Key != "new" {
		t.Fatalf("after Install: %v at %d", kvs, rev)
	}
	at := s.Watch(ctx, "", 21)
	if _, err := s.Commit(ctx, mvcc.Put("new", nil, nil)); err != nil {
		t.Fatal(err)
	}
	if evs := flatten(responses(t, at, 1)); evs[0].Revision() != 21 || evs[0].KV.CreateRevision != 19 {
		t.Fatalf("after Install: %+v", evs)
	}
	// The old history is gone, even below the new state's revision.
	s.Install(30, 1, nil)
	from1 := s.Watch(ctx, "", 1)
	if _, err := s.Commit(ctx, mvcc.Put("marker", nil, nil)); err != nil {
		t.Fatal(err)
	}
	if evs := flatten(responses(t, from1, 1)); evs[0].Revision() != 31 {
		t.Fatalf("a watch from 1 after Install: %+v", evs)
	}
}

// TestCompactToOnlyRaisesUpToTheNextRevision.
func TestCompactToOnlyRaisesUpToTheNextRevision(t *testing.T) {
	ctx, m, s := setup(t, 0, 5, "k")
	for _, c := range []struct{ to, want int64 }{{3, 3}, {2, 3}, {100, m.rev + 1}, {m.rev, m.rev + 1}} {
		s.CompactTo(c.to)
		if got, _ := s.Revisions(); got != c.want {
			t.Fatalf("CompactTo(%d): watermark %d, want %d", c.to, got, c.want)
		}
	}
	w := s.Watch(ctx, "", m.rev+1) // the watermark itself: no error
	quiet(t, ctx, m, s, w, "")
}

// TestWatchPrefixAndCancel: a watch sees only its prefix; cancelling its
// context closes its channel without an error.
func TestWatchPrefixAndCancel(t *testing.T) {
	ctx, m, s := setup(t, 0, 0, "")
	wctx, cancel := context.WithCancel(ctx)
	w := s.Watch(wctx, "p/", 0)
	both(t, ctx, m, s, op{kind: "put", key: "q/1"})
	both(t, ctx, m, s, op{kind: "put", key: "p"})
	quiet(t, ctx, m, s, w, "p/")
	cancel()
	closes(t, w)
}

func TestWatchInvalidArguments(t *testing.T) {
	s := mvcc.New(mvcc.Config{})
	defer s.Close()
	ctx, cancel := context.WithCancel(context.Background())
	for name, c := range map[string]struct {
		prefix string
		from   int64
		want   error
	}{
		"bad prefix":    {"\xff", 0, store.ErrInvalidKey},
		"negative from": {"", -1, nil},
	} {
		resp, ok := <-s.Watch(ctx, c.prefix, c.from)
		if !ok || resp.Err == nil || (c.want != nil && !errors.Is(resp.Err, c.want)) || errors.Is(resp.Err, store.ErrCompacted) {
			t.Errorf("%s: %+v", name, resp)
		}
	}
	cancel()
	if resp := <-s.Watch(ctx, "", 0); !errors.Is(resp.Err, context.Canceled) {
		t.Fatalf("watch with a cancelled context: %+v", resp)
	}
}

// TestCloseEndsEverything: Close closes every watch without an error,
// waits for their goroutines (goleak), refuses every later call with
// store.ErrClosed, and is idempotent; a change applied after it (a file
// store's last catch-up) does not panic.
func TestCloseEndsEverything(t *testing.T) {
	ctx := context.Background()
	s := mvcc.New(mvcc.Config{})
	var ws []store.WatchChan
	for i := range 5 {
		ws = append(ws, s.Watch(ctx, "", int64(i)))
	}
	s.Close()
	s.Close()
	for _, w := range ws {
		closes(t, w)
	}
	select {
	case <-s.Done():
	default:
		t.Fatal("Done not closed")
	}
	if !s.Closed() || !errors.Is(s.Usable(ctx), store.ErrClosed) {
		t.Fatal("not closed")
	}
	if _, err := s.Commit(ctx, mvcc.Put("k", nil, nil)); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("Commit after Close: %v", err)
	}
	if _, err := s.Prepare(mvcc.Put("k", nil, nil)); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("Prepare after Close: %v", err)
	}
	if err := s.Compact(ctx, 1); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("Compact after Close: %v", err)
	}
	if resp := <-s.Watch(ctx, "", 0); !errors.Is(resp.Err, store.ErrClosed) {
		t.Fatalf("Watch after Close: %+v", resp)
	}
	if err := s.Apply(2, []store.Event{{Type: store.EventPut, KV: store.KeyValue{Key: "k", Value: []byte{}, CreateRevision: 2, ModRevision: 2}}}); err != nil {
		t.Fatalf("Apply after Close: %v", err)
	}
	s.Install(3, 3, nil)
}
