package registrytest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store"
)

// Factory returns a new registry (a new "process") over the backend under
// test. The suite closes every registry it gets.
type Factory func(t testing.TB) registry.Registry

// Options adapt the suite to an implementation.
type Options struct {
	// Caveats maps check names (e.g. "Watch/Resume") to the reason the
	// implementation cannot pass them; such checks are skipped with it.
	Caveats map[string]string
	// Timeout bounds every wait for an event; default 15 s.
	Timeout time.Duration
	// Store returns a client of the backend's store for the health checks
	// ("Health/..."): they act as a checker does, writing verdicts beside
	// their instances ({instance key}/health) under a lease of their own,
	// and check what the registry shows. The registries of the factory
	// must use the keyspace their Keyspace method (if any) returns, else
	// the root "". Nil: the checks write verdicts through the VerdictSink
	// of a registry of the factory (registry.VerdictKeeper: registry/kube),
	// or are skipped if it has none.
	Store func(t testing.TB) store.Store
}

type check struct {
	name string
	fn   func(t *testing.T, h *harness)
}

var checks = []check{
	{"Register/FillsDefaults", testRegisterDefaults},
	{"Register/InvalidWritesNothing", testRegisterInvalid},
	{"Register/UniqueAcrossProcesses", testUniqueAcrossProcesses},
	{"Register/UniqueInProcess", testUniqueInProcess},
	{"Register/ConcurrentBurst", testConcurrentBurst},
	{"Update/AddressIsUpdated", testUpdateAddress},
	{"Update/IdentityRefused", testUpdateIdentity},
	{"Update/InvalidChangesNothing", testUpdateInvalid},
	{"Drain/DrainingThenRemoved", testDrain},
	{"Close/Deregisters", testCloseDeregisters},
	{"Close/RegistryRemovesAll", testRegistryClose},
	{"List/QueryAndPrefixIsolation", testListQuery},
	{"Watch/SnapshotFirst", testWatchSnapshotFirst},
	{"Watch/EmptySnapshot", testWatchEmptySnapshot},
	{"Watch/OrderedEvents", testWatchOrdered},
	{"Watch/SlowConsumerConverges", testSlowConsumer},
	{"Watch/LocalCancelKeepsView", testLocalCancel},
	{"Watch/Resume", testWatchResume},
	{"Watch/InvalidQuery", testWatchInvalidQuery},
	{"Health/DeclaredCheckIsUnknown", testHealthUnknown},
	{"Health/VerdictJoined", testHealthVerdict},
	{"Health/VerdictLeaseRevoked", testHealthVerdictRevoked},
	{"Health/VerdictBeforeInstance", testHealthVerdictFirst},
	{"Health/Panic", testHealthPanic},
}

// Run runs every check against registries from newRegistry.
func Run(t *testing.T, newRegistry Factory, opts Options) {
	if opts.Timeout == 0 {
		opts.Timeout = 15 * time.Second
	}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			if reason, ok := opts.Caveats[c.name]; ok {
				t.Skipf("not guaranteed by this implementation: %s", reason)
			}
			c.fn(t, &harness{newRegistry: newRegistry, opts: opts, ns: uniqueNamespace()})
		})
	}
}

type harness struct {
	newRegistry Factory
	opts        Options
	ns          string
}

// registry returns a new registry closed at the end of the check.
func (h *harness) registry(t *testing.T) registry.Registry {
	t.Helper()
	r := h.newRegistry(t)
	t.Cleanup(func() { _ = r.Close() })
	return r
}

func (h *harness) ctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*h.opts.Timeout)
	t.Cleanup(cancel)
	return ctx
}

func (h *harness) instance(component, endpoint, addr string) beacon.Instance {
	return beacon.Instance{Namespace: h.ns, Component: component, Endpoint: endpoint, Address: addr, Transport: "http"}
}

func uniqueNamespace() string {
	var b [5]byte
	_, _ = rand.Read(b[:])
	return "rt-" + hex.EncodeToString(b[:])
}

// next waits for the next batch of w, failing the check on error or timeout.
func (h *harness) next(t *testing.T, w registry.Watcher) registry.Batch {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), h.opts.Timeout)
	defer cancel()
	b, err := w.Next(ctx)
	if err != nil {
		t.Fatalf("Watcher.Next: %v", err)
	}
	return b
}

// until applies batches of w to v until cond holds.
func (h *harness) until(t *testing.T, w registry.Watcher, v *View, what string, cond func(*View) bool) {
	t.Helper()
	deadline := time.Now().Add(h.opts.Timeout)
	for !cond(v) {
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		b, err := w.Next(ctx)
		cancel()
		if err != nil {
			t.Fatalf("waiting for %s: %v (view: %v)", what, err, v)
		}
		if err := v.Apply(b); err != nil {
			t.Fatal(err)
		}
	}
}

func (h *harness) watch(t *testing.T, r registry.Registry, q beacon.Query, opts ...registry.WatchOption) registry.Watcher {
	t.Helper()
	w, err := r.Watch(h.ctx(t), q, opts...)
	if err != nil {
		t.Fatalf("Watch(%q): %v", q, err)
	}
	t.Cleanup(func() { _ = w.Close() })
	return w
}

func (h *harness) register(t *testing.T, r registry.Registry, in beacon.Instance) registry.Registration {
	t.Helper()
	reg, err := r.Register(h.ctx(t), in)
	if err != nil {
		t.Fatalf("Register(%s): %v", in.Ref(), err)
	}
	return reg
}

func (h *harness) list(t *testing.T, r registry.Registry, q beacon.Query) []beacon.Instance {
	t.Helper()
	out, _, err := r.List(h.ctx(t), q)
	if err != nil {
		t.Fatalf("List(%q): %v", q, err)
	}
	return out
}

// View is a consumer's state built from a watcher's batches: what a
// well-behaved consumer holds. It checks the event contract as it goes:
// the first batch must be a Snapshot or Changes, Added only for an unknown
// ID, Updated and Removed only for a known one.
type View struct {
	byID     map[string]beacon.Instance
	started  bool
	Revision int64
	Batches  int
	Events   int
}

// NewView returns an empty view.
func NewView() *View { return &View{byID: map[string]beacon.Instance{}} }

// Apply applies one batch, returning an error if it breaks the contract.
func (v *View) Apply(b registry.Batch) error {
	v.Batches++
	switch b.Kind {
	case registry.Stale:
		if len(b.Events) != 0 {
			return fmt.Errorf("stale batch with %d events", len(b.Events))
		}
		return nil
	case registry.Snapshot:
		clear(v.byID)
	case registry.Changes, registry.Resync:
		if !v.started && b.Kind == registry.Resync {
			return fmt.Errorf("first batch is %v, want snapshot or changes", b.Kind)
		}
	default:
		return fmt.Errorf("unknown batch kind %v", b.Kind)
	}
	v.started = true
	if b.Revision < v.Revision {
		return fmt.Errorf("batch revision %d after %d", b.Revision, v.Revision)
	}
	v.Revision = b.Revision
	last := int64(0)
	for _, e := range b.Events {
		v.Events++
		if b.Kind != registry.Snapshot {
			if e.Revision < last {
				return fmt.Errorf("events out of order: %d after %d", e.Revision, last)
			}
			last = e.Revision
		}
		if e.Revision > b.Revision {
			return fmt.Errorf("event at revision %d in a batch at %d", e.Revision, b.Revision)
		}
		id := e.Instance.Ref().String()
		_, known := v.byID[id]
		switch e.Type {
		case beacon.Added:
			if known {
				return fmt.Errorf("added %s, already known", id)
			}
			v.byID[id] = e.Instance
		case beacon.Updated:
			if !known {
				return fmt.Errorf("updated %s, never added", id)
			}
			v.byID[id] = e.Instance
		case beacon.Removed:
			if !known {
				return fmt.Errorf("removed %s, never added", id)
			}
			delete(v.byID, id)
		default:
			return fmt.Errorf("unknown event type %v", e.Type)
		}
	}
	return nil
}

// Get returns the instance with ref.String() == id.
func (v *View) Get(id string) (beacon.Instance, bool) {
	in, ok := v.byID[id]
	return in, ok
}

// Len returns the number of instances in the view.
func (v *View) Len() int { return len(v.byID) }

// Instances returns the view sorted by ref.
func (v *View) Instances() []beacon.Instance {
	keys := slices.Sorted(maps.Keys(v.byID))
	out := make([]beacon.Instance, len(keys))
	for i, k := range keys {
		out[i] = v.byID[k]
	}
	return out
}

func (v *View) String() string {
	var b strings.Builder
	b.WriteString("{")
	for i, in := range v.Instances() {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%s=%s(%s)", in.Ref(), in.Address, in.Status)
	}
	b.WriteString("}")
	return b.String()
}

// Equal reports whether the view holds exactly these instances.
func (v *View) Equal(list []beacon.Instance) bool {
	if len(list) != len(v.byID) {
		return false
	}
	for _, in := range list {
		got, ok := v.byID[in.Ref().String()]
		if !ok || !Same(got, in) {
			return false
		}
	}
	return true
}

// SameInstances reports whether a and b hold the same instances, in any
// order.
func SameInstances(a, b []beacon.Instance) bool {
	v := NewView()
	for _, in := range a {
		v.byID[in.Ref().String()] = in
	}
	return v.Equal(b)
}

func describe(list []beacon.Instance) string {
	v := NewView()
	for _, in := range list {
		v.byID[in.Ref().String()] = in
	}
	return v.String()
}

func wantErr(t *testing.T, what string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: got error %v, want %v", what, err, target)
	}
}
