package registrytest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry"
)

func testRegisterDefaults(t *testing.T, h *harness) {
	r := h.registry(t)
	before := time.Now().Add(-time.Second)
	reg := h.register(t, r, h.instance("api", "http", "10.0.0.1:80"))
	in := reg.Instance()
	if err := beacon.ValidateID(in.ID); err != nil {
		t.Fatalf("generated ID: %v", err)
	}
	if in.Status != beacon.StatusServing {
		t.Fatalf("status %q, want serving", in.Status)
	}
	if in.RegisteredAt.Before(before) || in.RegisteredAt.After(time.Now().Add(time.Second)) {
		t.Fatalf("registered_at %v is not now", in.RegisteredAt)
	}
	if err := reg.Err(); err != nil {
		t.Fatalf("Err: %v", err)
	}
	got := h.list(t, r, beacon.Query{Namespace: h.ns})
	if len(got) != 1 || !Same(got[0], in) {
		t.Fatalf("List = %s, want exactly %s", describe(got), describe([]beacon.Instance{in}))
	}
	// A caller-chosen ID is kept.
	custom := h.instance("api", "http", "10.0.0.2:80")
	custom.ID = "00000000000000aa"
	if got := h.register(t, r, custom).Instance().ID; got != custom.ID {
		t.Fatalf("ID %q, want %q", got, custom.ID)
	}
}

func testRegisterInvalid(t *testing.T, h *harness) {
	r := h.registry(t)
	ctx := h.ctx(t)
	big := map[string]string{"blob": strings.Repeat("x", beacon.DefaultMaxMetadataSize)}
	cases := map[string]beacon.Instance{
		"namespace": {Namespace: "Bad_NS", Component: "api", Endpoint: "http", Address: "10.0.0.1:80"},
		"component": {Namespace: h.ns, Component: "-api", Endpoint: "http", Address: "10.0.0.1:80"},
		"endpoint":  {Namespace: h.ns, Component: "api", Endpoint: "", Address: "10.0.0.1:80"},
		"id":        {Namespace: h.ns, Component: "api", Endpoint: "http", ID: "xyz", Address: "10.0.0.1:80"},
		"address":   {Namespace: h.ns, Component: "api", Endpoint: "http", Address: "no port"},
		"metadata":  {Namespace: h.ns, Component: "api", Endpoint: "http", Address: "10.0.0.1:80", Metadata: big},
		"status":    {Namespace: h.ns, Component: "api", Endpoint: "http", Address: "10.0.0.1:80", Status: "up"},
	}
	for field, in := range cases {
		_, err := r.Register(ctx, in)
		if !errors.Is(err, beacon.ErrInvalid) {
			t.Errorf("%s: got %v, want an error matching beacon.ErrInvalid", field, err)
		}
	}
	_, err := r.Register(ctx, cases["metadata"])
	wantErr(t, "metadata over the limit", err, beacon.ErrMetadataTooLarge)
	if got := h.list(t, r, beacon.Query{Namespace: h.ns}); len(got) != 0 {
		t.Fatalf("invalid registrations wrote %s", describe(got))
	}
}

func testUniqueAcrossProcesses(t *testing.T, h *harness) {
	a, b := h.registry(t), h.registry(t)
	w := h.watch(t, b, beacon.Query{Namespace: h.ns})
	v := NewView()
	first := h.register(t, a, h.instance("api", "http", "10.0.0.1:80"))
	claim := h.instance("api", "http", "10.9.9.9:80")
	claim.ID = first.Instance().ID
	_, err := b.Register(h.ctx(t), claim)
	wantErr(t, "second process registering a live ID", err, beacon.ErrAlreadyRegistered)
	got := h.list(t, b, beacon.Query{Namespace: h.ns})
	if len(got) != 1 || got[0].Address != "10.0.0.1:80" {
		t.Fatalf("after the refused claim List = %s, want the first registration untouched", describe(got))
	}
	// Once the holder deregisters, the ID is free.
	h.until(t, w, v, "the first registration", func(v *View) bool { return v.Len() == 1 })
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	h.until(t, w, v, "its removal", func(v *View) bool { return v.Len() == 0 })
	if got := h.register(t, b, claim).Instance(); got.Address != "10.9.9.9:80" {
		t.Fatalf("re-registered %s", got.Address)
	}
}

func testUniqueInProcess(t *testing.T, h *harness) {
	r := h.registry(t)
	in := h.instance("api", "http", "10.0.0.1:80")
	in.ID = beacon.NewID()
	h.register(t, r, in)
	_, err := r.Register(h.ctx(t), in)
	wantErr(t, "registering the same ID twice in one process", err, beacon.ErrAlreadyRegistered)
}

func testConcurrentBurst(t *testing.T, h *harness) {
	r := h.registry(t)
	ctx := h.ctx(t)
	const n = 200
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := r.Register(ctx, h.instance("burst", fmt.Sprintf("ep%d", i%5), fmt.Sprintf("10.0.%d.%d:80", i/250, i%250)))
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if got := h.list(t, r, beacon.Query{Namespace: h.ns}); len(got) != n {
		t.Fatalf("List has %d instances, want %d", len(got), n)
	}
}

func testUpdateAddress(t *testing.T, h *harness) {
	r := h.registry(t)
	w := h.watch(t, h.registry(t), beacon.Query{Namespace: h.ns})
	v := NewView()
	reg := h.register(t, r, h.instance("api", "http", "10.0.0.1:80"))
	id := reg.Instance().Ref().String()
	h.until(t, w, v, "the registration", func(v *View) bool { return v.Len() == 1 })
	events := v.Events
	err := reg.Update(h.ctx(t), func(in *beacon.Instance) {
		in.Address = "10.0.0.1:81"
		in.Metadata = map[string]string{"zone": "b"}
	})
	if err != nil {
		t.Fatal(err)
	}
	h.until(t, w, v, "the new address", func(v *View) bool {
		in, _ := v.Get(id)
		return in.Address == "10.0.0.1:81"
	})
	if v.Events != events+1 {
		t.Fatalf("an address change took %d events, want one Updated", v.Events-events)
	}
	in, _ := v.Get(id)
	if in.Metadata["zone"] != "b" || !Same(in, reg.Instance()) {
		t.Fatalf("watcher has %+v, registration says %+v", in, reg.Instance())
	}
}

func testUpdateIdentity(t *testing.T, h *harness) {
	r := h.registry(t)
	reg := h.register(t, r, h.instance("api", "http", "10.0.0.1:80"))
	for name, mutate := range map[string]func(*beacon.Instance){
		"id":            func(in *beacon.Instance) { in.ID = beacon.NewID() },
		"namespace":     func(in *beacon.Instance) { in.Namespace = "other" },
		"endpoint":      func(in *beacon.Instance) { in.Endpoint = "grpc" },
		"registered_at": func(in *beacon.Instance) { in.RegisteredAt = in.RegisteredAt.Add(time.Hour) },
	} {
		err := reg.Update(h.ctx(t), mutate)
		wantErr(t, "update of the "+name, err, registry.ErrIdentityChanged)
	}
}

func testUpdateInvalid(t *testing.T, h *harness) {
	r := h.registry(t)
	reg := h.register(t, r, h.instance("api", "http", "10.0.0.1:80"))
	before := reg.Instance()
	err := reg.Update(h.ctx(t), func(in *beacon.Instance) {
		in.Address = "10.0.0.2:80"
		in.Metadata = map[string]string{"blob": strings.Repeat("x", beacon.DefaultMaxMetadataSize+1)}
	})
	wantErr(t, "update with metadata over the limit", err, beacon.ErrMetadataTooLarge)
	err = reg.Update(h.ctx(t), func(in *beacon.Instance) { in.Address = "nope" })
	wantErr(t, "update with a bad address", err, beacon.ErrInvalidAddress)
	if got := reg.Instance(); !Same(got, before) {
		t.Fatalf("refused updates changed the registration to %+v", got)
	}
	got := h.list(t, r, beacon.Query{Namespace: h.ns})
	if len(got) != 1 || !Same(got[0], before) {
		t.Fatalf("refused updates changed the store: %s", describe(got))
	}
}

func testDrain(t *testing.T, h *harness) {
	r := h.registry(t)
	w := h.watch(t, h.registry(t), beacon.Query{Namespace: h.ns})
	v := NewView()
	reg := h.register(t, r, h.instance("api", "http", "10.0.0.1:80"))
	id := reg.Instance().Ref().String()
	h.until(t, w, v, "the registration", func(v *View) bool { return v.Len() == 1 })

	// A long grace, ended by the context once watchers saw the status.
	ctx, cancel := context.WithCancel(h.ctx(t))
	done := make(chan error, 1)
	go func() { done <- reg.Drain(ctx, registry.DrainGrace(time.Hour)) }()
	h.until(t, w, v, "status draining", func(v *View) bool {
		in, ok := v.Get(id)
		return ok && in.Status == beacon.StatusDraining
	})
	if in, _ := v.Get(id); in.Serving() || in.Address != "10.0.0.1:80" {
		t.Fatalf("draining instance %+v", in)
	}
	cancel()
	h.until(t, w, v, "the removal", func(v *View) bool { return v.Len() == 0 })
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Drain: %v", err)
		}
	case <-time.After(h.opts.Timeout):
		t.Fatal("Drain did not return after its context ended")
	}
	if err := reg.Close(); err != nil {
		t.Fatalf("Close after Drain: %v", err)
	}
}

func testCloseDeregisters(t *testing.T, h *harness) {
	r := h.registry(t)
	w := h.watch(t, h.registry(t), beacon.Query{Namespace: h.ns})
	v := NewView()
	keep := h.register(t, r, h.instance("api", "http", "10.0.0.1:80"))
	gone := h.register(t, r, h.instance("api", "http", "10.0.0.2:80"))
	h.until(t, w, v, "both registrations", func(v *View) bool { return v.Len() == 2 })
	if err := gone.Close(); err != nil {
		t.Fatal(err)
	}
	if err := gone.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	h.until(t, w, v, "the removal", func(v *View) bool { return v.Len() == 1 })
	if _, ok := v.Get(keep.Instance().Ref().String()); !ok {
		t.Fatalf("the wrong instance went: %v", v)
	}
}

func testRegistryClose(t *testing.T, h *harness) {
	r := h.newRegistry(t)
	w := h.watch(t, h.registry(t), beacon.Query{Namespace: h.ns})
	v := NewView()
	for i := range 3 {
		h.register(t, r, h.instance("api", "http", fmt.Sprintf("10.0.0.%d:80", i+1)))
	}
	h.until(t, w, v, "three registrations", func(v *View) bool { return v.Len() == 3 })
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	h.until(t, w, v, "every instance removed", func(v *View) bool { return v.Len() == 0 })
	_, err := r.Register(h.ctx(t), h.instance("api", "http", "10.0.0.9:80"))
	wantErr(t, "Register after Close", err, registry.ErrClosed)
}

func testListQuery(t *testing.T, h *harness) {
	r := h.registry(t)
	other := h.ns + "x" // a namespace that shares a prefix
	regs := map[string]beacon.Instance{}
	for _, in := range []beacon.Instance{
		h.instance("api", "http", "10.0.0.1:80"),
		h.instance("api", "grpc", "10.0.0.1:90"),
		h.instance("api2", "http", "10.0.0.2:80"),
		{Namespace: other, Component: "api", Endpoint: "http", Address: "10.0.0.3:80"},
	} {
		reg := h.register(t, r, in)
		regs[reg.Instance().Address] = reg.Instance()
	}
	cases := []struct {
		q    beacon.Query
		want []string
	}{
		{beacon.Query{Namespace: h.ns}, []string{"10.0.0.1:80", "10.0.0.1:90", "10.0.0.2:80"}},
		{beacon.Query{Namespace: h.ns, Component: "api"}, []string{"10.0.0.1:80", "10.0.0.1:90"}},
		{beacon.Query{Namespace: h.ns, Component: "api", Endpoint: "http"}, []string{"10.0.0.1:80"}},
		{beacon.Query{Namespace: other}, []string{"10.0.0.3:80"}},
	}
	for _, c := range cases {
		got, rev, err := r.List(h.ctx(t), c.q)
		if err != nil {
			t.Fatal(err)
		}
		if rev <= 0 {
			t.Errorf("List(%q) revision %d", c.q, rev)
		}
		var want []beacon.Instance
		for _, a := range c.want {
			want = append(want, regs[a])
		}
		if !SameInstances(got, want) {
			t.Errorf("List(%q) = %s, want %s", c.q, describe(got), describe(want))
		}
		for i := 1; i < len(got); i++ {
			if got[i-1].Ref().String() >= got[i].Ref().String() {
				t.Errorf("List(%q) not sorted: %s before %s", c.q, got[i-1].Ref(), got[i].Ref())
			}
		}
	}
	_, _, err := r.List(h.ctx(t), beacon.Query{Component: "api"})
	wantErr(t, "List with a component but no namespace", err, beacon.ErrInvalid)
}

func testWatchSnapshotFirst(t *testing.T, h *harness) {
	r := h.registry(t)
	var want []beacon.Instance
	for i := range 3 {
		want = append(want, h.register(t, r, h.instance("api", "http", fmt.Sprintf("10.0.0.%d:80", i+1))).Instance())
	}
	w := h.watch(t, h.registry(t), beacon.Query{Namespace: h.ns, Component: "api"})
	b := h.next(t, w)
	if b.Kind != registry.Snapshot {
		t.Fatalf("first batch is %v, want snapshot", b.Kind)
	}
	v := NewView()
	if err := v.Apply(b); err != nil {
		t.Fatal(err)
	}
	if !v.Equal(want) {
		t.Fatalf("snapshot %v, want %s", v, describe(want))
	}
	if !SameInstances(w.Instances(), want) {
		t.Fatalf("Instances() = %s after the snapshot", describe(w.Instances()))
	}
	if b.Revision <= 0 {
		t.Fatalf("snapshot revision %d", b.Revision)
	}
}

func testWatchEmptySnapshot(t *testing.T, h *harness) {
	w := h.watch(t, h.registry(t), beacon.Query{Namespace: h.ns})
	b := h.next(t, w)
	if b.Kind != registry.Snapshot || len(b.Events) != 0 {
		t.Fatalf("first batch %v with %d events, want an empty snapshot", b.Kind, len(b.Events))
	}
	if got := w.Instances(); len(got) != 0 {
		t.Fatalf("Instances() = %s", describe(got))
	}
}

func testWatchOrdered(t *testing.T, h *harness) {
	r := h.registry(t)
	w := h.watch(t, h.registry(t), beacon.Query{Namespace: h.ns})
	v := NewView()
	h.until(t, w, v, "the snapshot", func(v *View) bool { return v.Batches > 0 })
	ctx := h.ctx(t)
	var regs []registry.Registration
	for i := range 5 {
		regs = append(regs, h.register(t, r, h.instance("api", "http", fmt.Sprintf("10.0.0.%d:80", i+1))))
	}
	for i, reg := range regs[:3] {
		if err := reg.Update(ctx, func(in *beacon.Instance) { in.Address = fmt.Sprintf("10.1.0.%d:80", i+1) }); err != nil {
			t.Fatal(err)
		}
	}
	if err := regs[4].Close(); err != nil {
		t.Fatal(err)
	}
	want := h.list(t, r, beacon.Query{Namespace: h.ns})
	h.until(t, w, v, "the final state", func(v *View) bool { return v.Equal(want) })
	if !v.Equal(want) {
		t.Fatalf("watcher converged to %v, List says %s", v, describe(want))
	}
	if !SameInstances(w.Instances(), want) {
		t.Fatalf("Instances() = %s, List says %s", describe(w.Instances()), describe(want))
	}
}

func testSlowConsumer(t *testing.T, h *harness) {
	r := h.registry(t)
	watching := h.registry(t)
	fast := h.watch(t, watching, beacon.Query{Namespace: h.ns})
	slow := h.watch(t, watching, beacon.Query{Namespace: h.ns})
	fv, sv := NewView(), NewView()
	h.until(t, fast, fv, "the fast snapshot", func(v *View) bool { return v.Batches > 0 })
	if err := sv.Apply(h.next(t, slow)); err != nil {
		t.Fatal(err)
	}
	ctx := h.ctx(t)
	const instances, rounds = 5, 40
	var regs []registry.Registration
	for i := range instances {
		regs = append(regs, h.register(t, r, h.instance("api", "http", fmt.Sprintf("10.0.0.%d:80", i+1))))
	}
	// The fast consumer keeps up; the slow one does not read at all.
	fastDone := make(chan error, 1)
	go func() {
		for {
			b, err := fast.Next(ctx)
			if err != nil {
				fastDone <- err
				return
			}
			if err := fv.Apply(b); err != nil {
				fastDone <- err
				return
			}
			if fv.Len() == instances-1 {
				if in, _ := fv.Get(regs[0].Instance().Ref().String()); in.Address == fmt.Sprintf("10.2.%d.1:80", rounds-1) {
					fastDone <- nil
					return
				}
			}
		}
	}()
	for round := range rounds {
		for i, reg := range regs[:instances-1] {
			if err := reg.Update(ctx, func(in *beacon.Instance) { in.Address = fmt.Sprintf("10.2.%d.%d:80", round, i+1) }); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := regs[instances-1].Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-fastDone:
		if err != nil {
			t.Fatalf("fast consumer: %v", err)
		}
	case <-time.After(h.opts.Timeout):
		t.Fatalf("the fast consumer did not keep up (view %v)", fv)
	}
	want := h.list(t, r, beacon.Query{Namespace: h.ns})
	if !fv.Equal(want) {
		t.Fatalf("fast consumer has %v, want %s", fv, describe(want))
	}
	// The slow consumer catches up in a few coalesced batches.
	events := sv.Events
	h.until(t, slow, sv, "the slow consumer's catch-up", func(v *View) bool { return v.Equal(want) })
	if n := sv.Events - events; n > 3*instances {
		t.Errorf("slow consumer needed %d events to catch up on %d instances; want them coalesced", n, instances)
	}
}

func testLocalCancel(t *testing.T, h *harness) {
	r := h.registry(t)
	for i := range 2 {
		h.register(t, r, h.instance("api", "http", fmt.Sprintf("10.0.0.%d:80", i+1)))
	}
	ctx, cancel := context.WithCancel(context.Background())
	w, err := h.registry(t).Watch(ctx, beacon.Query{Namespace: h.ns})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	v := NewView()
	h.until(t, w, v, "the snapshot", func(v *View) bool { return v.Len() == 2 })
	cancel()
	// The watch ends with an error, never with removals or an empty list.
	deadline := time.Now().Add(h.opts.Timeout)
	for {
		nctx, ncancel := context.WithDeadline(context.Background(), deadline)
		b, err := w.Next(nctx)
		ncancel()
		if errors.Is(err, context.DeadlineExceeded) {
			t.Fatal("the watch did not end after its context was cancelled")
		}
		if err != nil {
			if !errors.Is(err, registry.ErrWatchClosed) {
				t.Fatalf("after cancel, Next: %v, want ErrWatchClosed", err)
			}
			break
		}
		for _, e := range b.Events {
			if e.Type == beacon.Removed {
				t.Fatalf("local cancel delivered a removal of %s", e.Instance.Ref())
			}
		}
	}
	if got := w.Instances(); len(got) != 2 {
		t.Fatalf("after cancel Instances() = %s, want the last view kept", describe(got))
	}
}

func testWatchResume(t *testing.T, h *harness) {
	r := h.registry(t)
	watching := h.registry(t)
	ctx := h.ctx(t)
	a := h.register(t, r, h.instance("api", "http", "10.0.0.1:80"))
	b := h.register(t, r, h.instance("api", "http", "10.0.0.2:80"))
	c := h.register(t, r, h.instance("api", "http", "10.0.0.3:80"))
	q := beacon.Query{Namespace: h.ns}
	w := h.watch(t, watching, q)
	v := NewView()
	h.until(t, w, v, "the snapshot", func(v *View) bool { return v.Len() == 3 })
	at := v.Revision
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	// Changes while the consumer is away: add, update, remove, and a
	// registration that comes and goes.
	h.register(t, r, h.instance("api", "http", "10.0.0.4:80"))
	if err := a.Update(ctx, func(in *beacon.Instance) { in.Address = "10.1.0.1:80" }); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := h.register(t, r, h.instance("api", "http", "10.0.0.5:80")).Close(); err != nil {
		t.Fatal(err)
	}
	_ = c
	want := h.list(t, r, q)

	w2 := h.watch(t, watching, q, registry.FromRevision(at))
	first := h.next(t, w2)
	switch first.Kind {
	case registry.Changes:
		// Applied to the state at the resume revision, the changes give
		// the current state.
		if err := v.Apply(first); err != nil {
			t.Fatalf("resumed batch: %v", err)
		}
		h.until(t, w2, v, "the current state", func(v *View) bool { return v.Equal(want) })
	case registry.Snapshot:
		v = NewView()
		if err := v.Apply(first); err != nil {
			t.Fatal(err)
		}
		h.until(t, w2, v, "the current state", func(v *View) bool { return v.Equal(want) })
	default:
		t.Fatalf("first batch of a resumed watch is %v", first.Kind)
	}
	if !v.Equal(want) {
		t.Fatalf("resumed watcher has %v, want %s", v, describe(want))
	}
}

func testWatchInvalidQuery(t *testing.T, h *harness) {
	r := h.registry(t)
	_, err := r.Watch(h.ctx(t), beacon.Query{Namespace: h.ns, Endpoint: "http"})
	wantErr(t, "Watch with an endpoint but no component", err, beacon.ErrInvalid)
	_, err = r.Watch(h.ctx(t), beacon.Query{Namespace: "Not_A_Label"})
	wantErr(t, "Watch of a bad namespace", err, beacon.ErrInvalid)
}
