package etcdnaming_test

import (
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon/naming/etcdnaming"
	"github.com/beaconplane/beacon/store"
	"github.com/prometheus/client_golang/prometheus"
)

func TestManagerWritesListsDeletes(t *testing.T) {
	ctx := testContext(t)
	st := memStore(t)
	m := newManager(t, st, "foo/bar/svc")
	if m.Target() != "foo/bar/svc" {
		t.Errorf("Target = %q", m.Target())
	}
	if err := m.AddEndpoint(ctx, "foo/bar/svc/a", etcdnaming.Endpoint{Addr: "10.0.0.1:1", Metadata: map[string]any{"zone": "a"}}); err != nil {
		t.Fatal(err)
	}
	if err := m.AddEndpoint(ctx, "foo/bar/svc/b", etcdnaming.Endpoint{Addr: "10.0.0.2:1"}); err != nil {
		t.Fatal(err)
	}
	kv, err := st.Get(ctx, "foo/bar/svc/a")
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"Op":0,"Addr":"10.0.0.1:1","Metadata":{"zone":"a"}}`; string(kv.Value) != want {
		t.Errorf("stored %s, want %s", kv.Value, want)
	}
	got, err := m.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got["foo/bar/svc/b"].Addr != "10.0.0.2:1" || got["foo/bar/svc/a"].Metadata.(map[string]any)["zone"] != "a" {
		t.Errorf("List = %+v", got)
	}
	if err := m.DeleteEndpoint(ctx, "foo/bar/svc/a"); err != nil {
		t.Fatal(err)
	}
	if err := m.DeleteEndpoint(ctx, "foo/bar/svc/a"); err != nil { // absent: fine, as with etcd
		t.Errorf("deleting an absent endpoint: %v", err)
	}
	if got, _ := m.List(ctx); len(got) != 1 {
		t.Errorf("after delete: %+v", got)
	}
}

// A multi-endpoint update is one transaction: watchers see it as one
// revision.
func TestManagerUpdateIsAtomic(t *testing.T) {
	ctx := testContext(t)
	st := memStore(t)
	m := newManager(t, st, "svc")
	if err := m.AddEndpoint(ctx, "svc/a", etcdnaming.Endpoint{Addr: "10.0.0.1:1"}); err != nil {
		t.Fatal(err)
	}
	_, rev, err := st.List(ctx, "svc/")
	if err != nil {
		t.Fatal(err)
	}
	ch := st.Watch(ctx, "svc/", rev+1)
	if err := m.Update(ctx,
		etcdnaming.NewAddUpdate("svc/b", etcdnaming.Endpoint{Addr: "10.0.0.2:1"}),
		etcdnaming.NewAddUpdate("svc/c", etcdnaming.Endpoint{Addr: "10.0.0.3:1"}),
		etcdnaming.NewDeleteUpdate("svc/a")); err != nil {
		t.Fatal(err)
	}
	select {
	case resp := <-ch:
		if resp.Err != nil || len(resp.Events) != 3 {
			t.Fatalf("watch response %+v; want the 3 changes together", resp)
		}
		for _, ev := range resp.Events {
			if ev.Revision() != rev+1 {
				t.Errorf("event %s at revision %d, want %d", ev.KV.Key, ev.Revision(), rev+1)
			}
		}
	case <-ctx.Done():
		t.Fatal("no watch response")
	}
}

func TestManagerRejectsBadUpdatesAndWritesNothing(t *testing.T) {
	ctx := testContext(t)
	st := memStore(t)
	m := newManager(t, st, "foo/bar")
	good := etcdnaming.NewAddUpdate("foo/bar/ok", etcdnaming.Endpoint{Addr: "10.0.0.1:1"})
	for _, tc := range []struct {
		name   string
		update etcdnaming.Update
		err    error
		has    string
	}{
		{"sibling prefix", etcdnaming.NewAddUpdate("foo/barx/1", etcdnaming.Endpoint{Addr: "a:1"}), etcdnaming.ErrKeyOutsideTarget, `must be "foo/bar/" followed by a name`},
		{"other prefix", etcdnaming.NewAddUpdate("other/1", etcdnaming.Endpoint{Addr: "a:1"}), etcdnaming.ErrKeyOutsideTarget, `key "other/1"`},
		{"the target itself", etcdnaming.NewDeleteUpdate("foo/bar"), etcdnaming.ErrKeyOutsideTarget, ""},
		{"no name", etcdnaming.NewDeleteUpdate("foo/bar/"), etcdnaming.ErrKeyOutsideTarget, ""},
		{"no address", etcdnaming.NewAddUpdate("foo/bar/x", etcdnaming.Endpoint{}), etcdnaming.ErrInvalidEndpoint, "Addr is empty"},
		{"bad metadata", etcdnaming.NewAddUpdate("foo/bar/x", etcdnaming.Endpoint{Addr: "a:1", Metadata: func() {}}), etcdnaming.ErrInvalidEndpoint, "not JSON-encodable"},
		{"bad op", etcdnaming.Update{Op: 7, Key: "foo/bar/x"}, etcdnaming.ErrInvalidEndpoint, "bad update op 7"},
		{"twice", good, etcdnaming.ErrInvalidEndpoint, "updated twice"},
	} {
		err := m.Update(ctx, good, tc.update)
		if !errors.Is(err, tc.err) || !strings.Contains(err.Error(), tc.has) {
			t.Errorf("%s: %v; want %v containing %q", tc.name, err, tc.err, tc.has)
		}
	}
	if kvs, _, _ := st.List(ctx, ""); len(kvs) != 0 {
		t.Errorf("rejected updates wrote %+v", kvs)
	}
}

func TestManagerLease(t *testing.T) {
	ctx := testContext(t)
	st := memStore(t)
	m := newManager(t, st, "svc")
	l, err := st.Grant(ctx, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.AddEndpoint(ctx, "svc/a", etcdnaming.Endpoint{Addr: "10.0.0.1:1"}, etcdnaming.WithLease(l.ID)); err != nil {
		t.Fatal(err)
	}
	if kv, err := st.Get(ctx, "svc/a"); err != nil || kv.Lease != l.ID {
		t.Fatalf("key %+v, %v; want bound to lease %d", kv, err, l.ID)
	}
	if err := st.Revoke(ctx, l.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Get(ctx, "svc/a"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("after revoke: %v", err)
	}
	// A lease that ended fails the update.
	if err := m.AddEndpoint(ctx, "svc/b", etcdnaming.Endpoint{Addr: "10.0.0.1:1"}, etcdnaming.WithLease(l.ID)); !errors.Is(err, store.ErrLeaseNotFound) {
		t.Errorf("add with an ended lease: %v", err)
	}
}

// noTxnStore hides the memory store's transactions, as a backend without
// them would.
type noTxnStore struct{ store.Store }

func TestManagerWithoutTransactions(t *testing.T) {
	ctx := testContext(t)
	st := noTxnStore{memStore(t)}
	m := newManager(t, st, "svc")
	if err := m.AddEndpoint(ctx, "svc/a", etcdnaming.Endpoint{Addr: "10.0.0.1:1"}); err != nil {
		t.Fatal(err)
	}
	if err := m.DeleteEndpoint(ctx, "svc/zzz"); err != nil {
		t.Errorf("deleting an absent endpoint: %v", err)
	}
	err := m.Update(ctx, etcdnaming.NewDeleteUpdate("svc/a"), etcdnaming.NewAddUpdate("svc/b", etcdnaming.Endpoint{Addr: "b:1"}))
	if !errors.Is(err, etcdnaming.ErrNoTransactions) {
		t.Errorf("multi-key update: %v", err)
	}
	if got, _ := m.List(ctx); len(got) != 1 {
		t.Errorf("a refused update wrote: %+v", got)
	}
}

func TestNewManagerValidates(t *testing.T) {
	st := memStore(t)
	if _, err := etcdnaming.NewManager(nil, "svc"); !errors.Is(err, etcdnaming.ErrInvalidConfig) {
		t.Errorf("nil store: %v", err)
	}
	for _, target := range []string{"", "svc/", "\xff"} {
		if _, err := etcdnaming.NewManager(st, target); !errors.Is(err, etcdnaming.ErrInvalidTarget) {
			t.Errorf("target %q: %v", target, err)
		}
	}
	if _, err := etcdnaming.NewManager(st, "svc", etcdnaming.WithProbeInterval(-1)); !errors.Is(err, etcdnaming.ErrInvalidConfig) {
		t.Errorf("negative interval: %v", err)
	}
	if _, err := etcdnaming.NewManager(st, "/services/leading-slash"); err != nil {
		t.Errorf("a target with a leading slash is a valid etcd prefix: %v", err)
	}
}

func TestListSkipsValuesThatAreNotEndpoints(t *testing.T) {
	ctx := testContext(t)
	st := memStore(t)
	reg := prometheus.NewRegistry()
	logs := &strings.Builder{}
	m := newManager(t, st, "svc", etcdnaming.WithMetrics(reg), etcdnaming.WithLogger(slog.New(slog.NewTextHandler(logs, nil))))
	for key, v := range map[string]string{"svc/a": `{"Addr":"a:1"}`, "svc/b": `garbage`, "svc/c": `{"Metadata":1}`} {
		if _, err := st.Put(ctx, key, []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	got, err := m.List(ctx)
	if err != nil || len(got) != 1 || got["svc/a"].Addr != "a:1" {
		t.Fatalf("List = %+v, %v", got, err)
	}
	if n := counter(t, reg, "beacon_naming_skipped_total", "invalid_json"); n != 1 {
		t.Errorf("invalid_json = %v", n)
	}
	if n := counter(t, reg, "beacon_naming_skipped_total", "no_addr"); n != 1 {
		t.Errorf("no_addr = %v", n)
	}
	if !strings.Contains(logs.String(), "key=svc/b") || !strings.Contains(logs.String(), "key=svc/c") {
		t.Errorf("skips not logged:\n%s", logs)
	}
}
