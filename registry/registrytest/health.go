package registrytest

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store"
)

// The health checks: a checker's verdict, written beside its instance
// under the checker's own lease (or, on a registry that keeps verdicts
// itself, through the VerdictSink of a registry of its own), is joined to
// the instance by List, Get and Watch; the checker dying takes its
// verdicts away (fail-open); a service (at one priority) with more
// failing instances than the panic threshold (the default, 0.5) serves
// them all.

// checker is a health checker as the checks play it: a store client and
// a lease its verdicts are bound to, or a process of its own (reg) and
// its registry's VerdictSink.
type checker struct {
	st    store.Store
	ks    beacon.Keyspace
	lease store.LeaseID

	reg  registry.Registry
	sink registry.VerdictSink
}

// checker returns a checker over the backend, or skips the check.
func (h *harness) checker(t *testing.T, r registry.Registry) *checker {
	t.Helper()
	if h.opts.Store == nil {
		reg := h.registry(t) // the checker's own process
		k, ok := reg.(registry.VerdictKeeper)
		if !ok {
			t.Skip("no store to write verdicts with (Options.Store), and the registry keeps none itself (registry.VerdictKeeper)")
		}
		sink, err := k.VerdictSink("conformance")
		if err != nil {
			t.Fatalf("checker: VerdictSink: %v", err)
		}
		return &checker{reg: reg, sink: sink}
	}
	c := &checker{st: h.opts.Store(t)}
	if k, ok := r.(interface{ Keyspace() beacon.Keyspace }); ok {
		c.ks = k.Keyspace()
	}
	c.grant(t, h)
	return c
}

func (c *checker) grant(t *testing.T, h *harness) {
	t.Helper()
	l, err := c.st.Grant(h.ctx(t), time.Minute)
	if err != nil {
		t.Fatalf("checker: grant a lease: %v", err)
	}
	c.lease = l.ID
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), h.opts.Timeout)
		defer cancel()
		_ = c.st.Revoke(ctx, l.ID)
	})
}

// say writes the checker's verdict s on the instance at ref.
func (c *checker) say(t *testing.T, h *harness, ref beacon.Ref, s beacon.HealthStatus) {
	t.Helper()
	v := beacon.Health{Status: s, Reason: "conformance says " + string(s), Since: time.Now().UTC(), Checker: "conformance"}
	if c.sink != nil {
		if err := c.sink.PutVerdict(h.ctx(t), ref, v); err != nil {
			t.Fatalf("checker: write the verdict on %s: %v", ref, err)
		}
		return
	}
	val, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.st.Put(h.ctx(t), c.ks.HealthKey(ref), val, store.WithLease(c.lease)); err != nil {
		t.Fatalf("checker: write the verdict on %s: %v", ref, err)
	}
}

func (h *harness) checked(component, addr string) beacon.Instance {
	in := h.instance(component, "rpc", addr)
	in.Check = &beacon.Check{Kind: beacon.CheckTCP}
	return in
}

// healthString describes in's health: "-" for none, the status, with
// " (panic)" for a failing instance served because its service panics.
func healthString(in beacon.Instance) string {
	switch {
	case in.Health == nil:
		return "-"
	case in.Health.Panic:
		return string(in.Health.Status) + " (panic)"
	}
	return string(in.Health.Status)
}

// healthOf describes the health of every instance in list, in address
// order: "address=health".
func healthOf(list []beacon.Instance) string {
	parts := make([]string, 0, len(list))
	for _, in := range list {
		parts = append(parts, in.Address+"="+healthString(in))
	}
	slices.Sort(parts)
	return strings.Join(parts, " ")
}

// untilHealth waits until the watcher's view, List and Get all show want
// (healthOf), and every instance is served as its health says.
func (h *harness) untilHealth(t *testing.T, r registry.Registry, w registry.Watcher, v *View, q beacon.Query, want string) {
	t.Helper()
	h.until(t, w, v, "health "+want, func(v *View) bool { return healthOf(v.Instances()) == want })
	list := h.list(t, r, q)
	if got := healthOf(list); got != want {
		t.Fatalf("List shows %s, the watch %s", got, want)
	}
	for _, in := range list {
		got, err := registry.Get(h.ctx(t), r, in.Ref())
		if err != nil || healthString(got) != healthString(in) {
			t.Fatalf("Get(%s) = %s, %v; List shows %s", in.Ref(), healthString(got), err, healthString(in))
		}
		if serving := in.Health == nil || in.Health.Status != beacon.HealthFailing || in.Health.Panic; in.Serving() != serving {
			t.Fatalf("%s with health %s: Serving() = %v", in.Address, healthString(in), in.Serving())
		}
	}
}

func testHealthUnknown(t *testing.T, h *harness) {
	r := h.registry(t)
	c := h.checker(t, r)
	q := beacon.Query{Namespace: h.ns}
	w := h.watch(t, r, q)
	v := NewView()
	h.register(t, r, h.checked("api", "10.0.0.1:80"))
	plain := h.register(t, r, h.instance("api", "rpc", "10.0.0.2:80")).Instance()
	h.untilHealth(t, r, w, v, q, "10.0.0.1:80=unknown 10.0.0.2:80=-")
	// A verdict on an instance that declares no check changes nothing.
	c.say(t, h, plain.Ref(), beacon.HealthFailing)
	h.register(t, r, h.instance("marker", "rpc", "10.0.0.9:80")) // written after the verdict
	h.untilHealth(t, r, w, v, q, "10.0.0.1:80=unknown 10.0.0.2:80=- 10.0.0.9:80=-")
}

// threeChecked registers three checked instances (10.0.0.1-3:80) of one
// service and watches them: the setup of the verdict checks.
func (h *harness) threeChecked(t *testing.T) (registry.Registry, *checker, beacon.Query, registry.Watcher, *View, []beacon.Ref) {
	t.Helper()
	r := h.registry(t)
	c := h.checker(t, r)
	q := beacon.Query{Namespace: h.ns}
	w := h.watch(t, h.registry(t), q)
	v := NewView()
	var refs []beacon.Ref
	for i := range 3 {
		refs = append(refs, h.register(t, r, h.checked("api", fmt.Sprintf("10.0.0.%d:80", i+1))).Instance().Ref())
	}
	h.untilHealth(t, r, w, v, q, "10.0.0.1:80=unknown 10.0.0.2:80=unknown 10.0.0.3:80=unknown")
	return r, c, q, w, v, refs
}

func testHealthVerdict(t *testing.T, h *harness) {
	r, c, q, w, v, refs := h.threeChecked(t)
	c.say(t, h, refs[0], beacon.HealthFailing)
	h.untilHealth(t, r, w, v, q, "10.0.0.1:80=failing 10.0.0.2:80=unknown 10.0.0.3:80=unknown")
	got, _ := v.Get(refs[0].String())
	if got.Health.Reason != "conformance says failing" || got.Health.Checker != "conformance" || got.Health.Since.IsZero() {
		t.Fatalf("the watch shows %+v, not the stored verdict", got.Health)
	}
	c.say(t, h, refs[0], beacon.HealthPassing)
	h.untilHealth(t, r, w, v, q, "10.0.0.1:80=passing 10.0.0.2:80=unknown 10.0.0.3:80=unknown")
}

func testHealthVerdictRevoked(t *testing.T, h *harness) {
	r, c, q, w, v, refs := h.threeChecked(t)
	c.say(t, h, refs[0], beacon.HealthFailing)
	h.untilHealth(t, r, w, v, q, "10.0.0.1:80=failing 10.0.0.2:80=unknown 10.0.0.3:80=unknown")
	// The checker dies: its lease ends (or its process, which keeps its
	// verdicts), and its verdicts with it.
	if c.sink != nil {
		if err := c.reg.Close(); err != nil {
			t.Fatalf("close the checker's registry: %v", err)
		}
	} else if err := c.st.Revoke(h.ctx(t), c.lease); err != nil {
		t.Fatalf("revoke the checker's lease: %v", err)
	}
	h.untilHealth(t, r, w, v, q, "10.0.0.1:80=unknown 10.0.0.2:80=unknown 10.0.0.3:80=unknown")
}

func testHealthVerdictFirst(t *testing.T, h *harness) {
	r := h.registry(t)
	c := h.checker(t, r)
	q := beacon.Query{Namespace: h.ns}
	w := h.watch(t, r, q)
	v := NewView()
	in := h.checked("api", "10.0.0.1:80")
	in.ID = "00000000000000c1"
	c.say(t, h, in.Ref(), beacon.HealthPassing)
	h.register(t, r, in)
	h.untilHealth(t, r, w, v, q, "10.0.0.1:80=passing")
}

func testHealthPanic(t *testing.T, h *harness) {
	r, c, q, w, v, refs := h.threeChecked(t)
	// Another service, unchecked, with a failing verdict: it counts for
	// nothing.
	web := h.register(t, r, h.instance("web", "rpc", "10.0.1.1:80")).Instance()
	c.say(t, h, web.Ref(), beacon.HealthFailing)
	c.say(t, h, refs[0], beacon.HealthFailing)
	h.untilHealth(t, r, w, v, q, "10.0.0.1:80=failing 10.0.0.2:80=unknown 10.0.0.3:80=unknown 10.0.1.1:80=-")
	c.say(t, h, refs[1], beacon.HealthFailing) // 2 of 3: more than half
	h.untilHealth(t, r, w, v, q, "10.0.0.1:80=failing (panic) 10.0.0.2:80=failing (panic) 10.0.0.3:80=unknown 10.0.1.1:80=-")
	c.say(t, h, refs[0], beacon.HealthPassing)
	h.untilHealth(t, r, w, v, q, "10.0.0.1:80=passing 10.0.0.2:80=failing 10.0.0.3:80=unknown 10.0.1.1:80=-")
}
