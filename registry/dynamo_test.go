package registry_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/dynamo"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store"
)

// dynamoEndpoint is the value the Dynamo runtime writes for an endpoint
// instance (reference/dynamo-discovery.md §1.3).
func dynamoEndpoint(ns, id, transport string) string {
	return `{"type":"Endpoint","namespace":"` + ns + `","component":"backend","endpoint":"generate","instance_id":` + id +
		`,"transport":` + transport + `,"device_type":null,"request_plane_codec":"msgpack"}`
}

func dynamoCard(ns, id, model string) string {
	return `{"type":"Model","namespace":"` + ns + `","component":"backend","endpoint":"generate","instance_id":` + id +
		`,"card_json":{"display_name":"` + model + `","context_length":40960},"model_suffix":null}`
}

// nextBatch returns w's next batch that is not Stale, within 10 s.
func nextBatch(t *testing.T, w registry.Watcher) registry.Batch {
	t.Helper()
	ctx := within(t, 10*time.Second)
	for {
		b, err := w.Next(ctx)
		if err != nil {
			t.Fatalf("Next: %v", err)
		}
		if b.Kind != registry.Stale {
			return b
		}
	}
}

func describe(b registry.Batch) string {
	var parts []string
	for _, e := range b.Events {
		parts = append(parts, e.Type.String()+" "+e.Instance.ID+" "+e.Instance.Address+" "+e.Instance.Transport+" "+
			e.Instance.Metadata[dynamo.MetaModels])
	}
	return b.Kind.String() + ": " + strings.Join(parts, "; ")
}

func wantBatch(t *testing.T, w registry.Watcher, want string) registry.Batch {
	t.Helper()
	b := nextBatch(t, w)
	if got := describe(b); got != want {
		t.Fatalf("batch %q, want %q", got, want)
	}
	return b
}

// TestDynamoLayoutServesWhatDynamoWrites writes what the Dynamo runtime
// writes, on leases, and follows it through List, Get and Watch: cards
// join their instances, a revoked lease removes its instance, a malformed
// entry is skipped without stopping the watch, and two entries of one ID
// remove it until one goes.
func TestDynamoLayoutServesWhatDynamoWrites(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			ns := "dyn-" + be.name
			st := be.store(t)
			r := newRegistry(t, be.store(t), registry.Config{Layout: registry.LayoutDynamo})
			ctx := within(t, 30*time.Second)
			put := func(key, val string, lease store.LeaseID) {
				t.Helper()
				if _, err := st.Put(ctx, key, []byte(val), store.WithLease(lease)); err != nil {
					t.Fatal(err)
				}
			}
			worker1, err := st.Grant(ctx, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			worker2, err := st.Grant(ctx, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			base := "v1/instances/" + ns + "/backend/generate/"
			put(base+"2a", dynamoEndpoint(ns, "42", `{"tcp":"10.0.0.5:9999/generate"}`), worker1.ID)
			put("v1/mdc/"+ns+"/backend/generate/2a", dynamoCard(ns, "42", "Qwen/Qwen3-0.6B"), worker1.ID)

			ins, _, err := r.List(ctx, beacon.Query{Namespace: ns})
			if err != nil || len(ins) != 1 || ins[0].ID != "000000000000002a" || ins[0].Address != "10.0.0.5:9999" ||
				ins[0].Metadata[dynamo.MetaModels] != "Qwen/Qwen3-0.6B" || ins[0].Metadata[dynamo.MetaInstanceID] != "42" {
				t.Fatalf("List = %+v, %v", ins, err)
			}
			w, err := r.Watch(ctx, beacon.Query{Namespace: ns})
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			wantBatch(t, w, "snapshot: added 000000000000002a 10.0.0.5:9999 tcp Qwen/Qwen3-0.6B")

			put(base+"2b", dynamoEndpoint(ns, "43", `{"http":"http://10.0.0.6:8888/v1/rpc/generate"}`), worker2.ID)
			wantBatch(t, w, "changes: added 000000000000002b 10.0.0.6:8888 http ")
			put("v1/mdc/"+ns+"/backend/generate/2a/my-lora", dynamoCard(ns, "42", "my-lora"), worker1.ID)
			wantBatch(t, w, "changes: updated 000000000000002a 10.0.0.5:9999 tcp Qwen/Qwen3-0.6B,my-lora")

			put(base+"2c", `{"type":"Endpoint","instance_id":-1`, worker2.ID) // not JSON: skipped
			put(base+"000000000000002b", dynamoEndpoint(ns, "43", `{"tcp":"10.0.0.7:9999/generate"}`), worker2.ID)
			wantBatch(t, w, "changes: removed 000000000000002b 10.0.0.6:8888 http ")
			if _, err := st.Delete(ctx, base+"000000000000002b"); err != nil {
				t.Fatal(err)
			}
			wantBatch(t, w, "changes: added 000000000000002b 10.0.0.6:8888 http ")

			if err := st.Revoke(ctx, worker1.ID); err != nil {
				t.Fatal(err)
			}
			wantBatch(t, w, "changes: removed 000000000000002a 10.0.0.5:9999 tcp Qwen/Qwen3-0.6B,my-lora")
			if in, err := r.Get(ctx, beacon.Ref{Namespace: ns, Component: "backend", Endpoint: "generate", ID: "000000000000002b"}); err != nil || in.Address != "10.0.0.6:8888" {
				t.Fatalf("Get = %+v, %v", in, err)
			}
			if _, err := r.Get(ctx, beacon.Ref{Namespace: ns, Component: "backend", Endpoint: "generate", ID: "000000000000002a"}); !errors.Is(err, beacon.ErrNotFound) {
				t.Fatalf("Get of a revoked instance = %v", err)
			}
		})
	}
}

// TestDynamoLayoutRefusesWrites pins that every write of a registry of the
// dynamo layout is refused, saying the layout is read-only, and writes
// nothing.
func TestDynamoLayoutRefusesWrites(t *testing.T) {
	st := newMemoryStore(t)
	r := newRegistry(t, st, registry.Config{Layout: registry.LayoutDynamo})
	ctx := within(t, 10*time.Second)
	in := beacon.Instance{Namespace: "dynamo", Component: "backend", Endpoint: "generate", Address: "10.0.0.5:9999"}
	ref := beacon.Ref{Namespace: "dynamo", Component: "backend", Endpoint: "generate", ID: "000000000000002a"}
	calls := map[string]func() error{
		"Register":        func() error { _, err := r.Register(ctx, in); return err },
		"RegisterWithTTL": func() error { _, err := r.RegisterWithTTL(ctx, in, time.Minute); return err },
		"RegisterLeased":  func() error { _, _, err := r.RegisterLeased(ctx, in, 1); return err },
		"GrantLease":      func() error { _, err := r.GrantLease(ctx, time.Minute); return err },
		"KeepAliveLease":  func() error { _, err := r.KeepAliveLease(ctx, 1); return err },
		"RevokeLease":     func() error { return r.RevokeLease(ctx, 1) },
		"Heartbeat":       func() error { _, err := r.Heartbeat(ctx, ref, registry.Secret("")); return err },
		"UpdateLeased": func() error {
			_, err := r.UpdateLeased(ctx, ref, registry.Secret(""), func(*beacon.Instance) {})
			return err
		},
		"DeregisterLeased":   func() error { return r.DeregisterLeased(ctx, ref, registry.Secret("")) },
		"DrainInstance":      func() error { _, err := r.DrainInstance(ctx, ref); return err },
		"DeregisterInstance": func() error { return r.DeregisterInstance(ctx, ref) },
		"Report":             func() error { return r.Report(ctx, ref) },
		"ReportLeased":       func() error { return r.ReportLeased(ctx, ref, registry.Secret("")) },
	}
	for name, call := range calls {
		err := call()
		if !errors.Is(err, registry.ErrReadOnlyLayout) || !strings.Contains(err.Error(), "read-only view") ||
			!strings.Contains(err.Error(), "Config.Layout beacon") {
			t.Errorf("%s = %v, want ErrReadOnlyLayout saying what to do", name, err)
		}
	}
	kvs, _, err := st.List(ctx, "")
	if err != nil || len(kvs) != 0 {
		t.Fatalf("the refused writes left %v (%v)", kvs, err)
	}
}

func TestLayoutConfig(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want registry.Layout
	}{{"", registry.LayoutBeacon}, {"beacon", registry.LayoutBeacon}, {" dynamo ", registry.LayoutDynamo}} {
		if got, err := registry.ParseLayout(tc.in); err != nil || got != tc.want {
			t.Errorf("ParseLayout(%q) = %v, %v", tc.in, got, err)
		}
	}
	if _, err := registry.ParseLayout("Dynamo"); !errors.Is(err, registry.ErrInvalidConfig) || !strings.Contains(err.Error(), "beacon") {
		t.Errorf("ParseLayout(Dynamo) = %v", err)
	}
	err := registry.Config{Layout: registry.LayoutDynamo, Root: "/beacon"}.Validate()
	if !errors.Is(err, registry.ErrInvalidConfig) || !strings.Contains(err.Error(), "no root") {
		t.Errorf("a root with the dynamo layout: %v", err)
	}
	if err := (registry.Config{Layout: "etcd"}).Validate(); !errors.Is(err, registry.ErrInvalidConfig) {
		t.Errorf("an unknown layout: %v", err)
	}
	t.Setenv(registry.LayoutEnv, "dynamo")
	if c, err := registry.ConfigFromEnv(); err != nil || c.Layout != registry.LayoutDynamo {
		t.Errorf("ConfigFromEnv = %+v, %v", c, err)
	}
	t.Setenv(registry.LayoutEnv, "v1")
	if _, err := registry.ConfigFromEnv(); err == nil || !strings.Contains(err.Error(), registry.LayoutEnv) {
		t.Errorf("ConfigFromEnv with a bad layout: %v", err)
	}
}

// TestDynamoLayoutQueriesApart: in the dynamo layout every watch reads
// Dynamo's whole root, yet each query gets its own instances only: a
// namespace's watch sees none of another's, nor of its nested namespaces.
func TestDynamoLayoutQueriesApart(t *testing.T) {
	st := newMemoryStore(t)
	r := newRegistry(t, st, registry.Config{Layout: registry.LayoutDynamo})
	ctx := within(t, 10*time.Second)
	for ns, id := range map[string]string{"qa": "1", "qb": "2", "qa.sub": "3"} {
		if _, err := st.Put(ctx, "v1/instances/"+ns+"/backend/generate/"+id, []byte(dynamoEndpoint(ns, id, `{"tcp":"10.0.0.`+id+`:9999/generate"}`))); err != nil {
			t.Fatal(err)
		}
	}
	for ns, want := range map[string]string{
		"qa":     "snapshot: added 0000000000000001 10.0.0.1:9999 tcp ",
		"qb":     "snapshot: added 0000000000000002 10.0.0.2:9999 tcp ",
		"qa.sub": "snapshot: added 0000000000000003 10.0.0.3:9999 tcp ",
	} {
		w, err := r.Watch(ctx, beacon.Query{Namespace: ns})
		if err != nil {
			t.Fatal(err)
		}
		wantBatch(t, w, want)
		_ = w.Close()
		if ins, _, err := r.List(ctx, beacon.Query{Namespace: ns}); err != nil || len(ins) != 1 {
			t.Fatalf("List(%s) = %v, %v", ns, ins, err)
		}
	}
	if n := r.WatchStreams(); n != 3 {
		t.Fatalf("%d shared watches, want one per query", n)
	}
}

// TestLayoutNames: a registry answers queries and refs of the names its
// layout holds. Beacon's refuses Dynamo's names as it always did (its
// writers never write them); the dynamo layout takes them.
func TestLayoutNames(t *testing.T) {
	ctx := within(t, 10*time.Second)
	q := beacon.Query{Namespace: "dynamo.t_1", Component: "backend", Endpoint: "clear_kv_blocks"}
	ref := beacon.Ref{Namespace: q.Namespace, Component: q.Component, Endpoint: q.Endpoint, ID: "000000000000002a"}
	own := newRegistry(t, newMemoryStore(t), registry.Config{})
	if _, _, err := own.List(ctx, q); !errors.Is(err, beacon.ErrInvalidName) || !strings.Contains(err.Error(), "DNS label") {
		t.Errorf("Beacon's layout: List = %v, want the label rule", err)
	}
	if _, err := own.Watch(ctx, q); !errors.Is(err, beacon.ErrInvalidName) {
		t.Errorf("Beacon's layout: Watch = %v", err)
	}
	if _, err := own.Get(ctx, ref); !errors.Is(err, beacon.ErrInvalidName) {
		t.Errorf("Beacon's layout: Get = %v", err)
	}
	if err := own.DeregisterInstance(ctx, ref); !errors.Is(err, beacon.ErrInvalidName) {
		t.Errorf("Beacon's layout: DeregisterInstance = %v", err)
	}
	if err := own.Report(ctx, ref); !errors.Is(err, beacon.ErrInvalidName) {
		t.Errorf("Beacon's layout: Report = %v", err)
	}
	dyn := newRegistry(t, newMemoryStore(t), registry.Config{Layout: registry.LayoutDynamo})
	if ins, _, err := dyn.List(ctx, q); err != nil || len(ins) != 0 {
		t.Errorf("dynamo layout: List = %v, %v", ins, err)
	}
	if _, err := dyn.Get(ctx, ref); !errors.Is(err, beacon.ErrNotFound) {
		t.Errorf("dynamo layout: Get = %v, want not found", err)
	}
	w, err := dyn.Watch(ctx, q)
	if err != nil {
		t.Fatalf("dynamo layout: Watch = %v", err)
	}
	defer w.Close()
	wantBatch(t, w, "snapshot: ")
	if registry.LayoutOf(dyn) != registry.LayoutDynamo || registry.LayoutOf(own) != registry.LayoutBeacon {
		t.Errorf("LayoutOf: %v, %v", registry.LayoutOf(dyn), registry.LayoutOf(own))
	}
}
