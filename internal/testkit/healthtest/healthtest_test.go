package healthtest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/testkit/healthtest"
	"github.com/beaconplane/beacon/registry"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func inst(id, addr string) beacon.Instance {
	return beacon.Instance{Namespace: "demo", Component: "greeter", Endpoint: "grpc", ID: id, Address: addr,
		Status: beacon.StatusServing, RegisteredAt: time.Unix(1_700_000_000, 0).UTC()}
}

const a, b, c, d = "000000000000000a", "000000000000000b", "000000000000000c", "000000000000000d"

func setup(t *testing.T) (context.Context, *healthtest.Registry) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx, healthtest.NewRegistry(t)
}

// health renders an instance's verdict as a reader sees it.
func health(in beacon.Instance) string {
	switch h := in.Health; {
	case h == nil:
		return "-"
	case h.Panic:
		return string(h.Status) + " (panic) " + h.Reason
	default:
		return string(h.Status) + " " + h.Reason
	}
}

// TestReadersSeeVerdicts: what Put writes, a registry's readers see, and a
// change of verdict alone is an update for watchers.
func TestReadersSeeVerdicts(t *testing.T) {
	ctx, r := setup(t)
	r.Put(t, healthtest.Passing(inst(a, "10.0.0.1:80")), healthtest.Failing(inst(b, "10.0.0.2:80"), "refused"),
		healthtest.Unknown(inst(c, "10.0.0.3:80")), inst(d, "10.0.0.4:80"))
	ins, _, err := r.List(ctx, beacon.Query{Namespace: "demo"})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{a: "passing ", b: "failing refused", c: "unknown ", d: "-"}
	if len(ins) != len(want) {
		t.Fatalf("listed %d instances, want %d", len(ins), len(want))
	}
	for _, in := range ins {
		if got := health(in); got != want[in.ID] {
			t.Errorf("%s: health %q, want %q", in.ID, got, want[in.ID])
		}
	}

	w, err := r.Watch(ctx, beacon.Query{Namespace: "demo"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if b, err := w.Next(ctx); err != nil || b.Kind != registry.Snapshot {
		t.Fatalf("first batch %v, %v", b.Kind, err)
	}
	r.Put(t, healthtest.Passing(inst(b, "10.0.0.2:80")))
	for {
		batch, err := w.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range batch.Events {
			if ev.Instance.ID == b && ev.Type == beacon.Updated && health(ev.Instance) == "passing " {
				return
			}
		}
	}
}

// TestPutRefusesVerdictWithoutCheck: a verdict on an instance that declares
// no check would be dropped by the registry's view; Put says so.
func TestPutRefusesVerdictWithoutCheck(t *testing.T) {
	ctx, r := setup(t)
	in := healthtest.Failing(inst(a, "10.0.0.1:80"), "x")
	in.Check = nil
	if err := healthtest.Put(ctx, r.Store, r.Keyspace(), in); err == nil {
		t.Fatal("Put wrote a verdict on an instance without a check")
	}
}

// TestPickersLeaveOutFailing: every picker leaves failing instances out,
// as draining ones, and serves failing ones of a service in panic.
func TestPickersLeaveOutFailing(t *testing.T) {
	one, two, three := inst(a, "10.0.0.1:80"), inst(b, "10.0.0.2:80"), inst(c, "10.0.0.3:80")
	for _, tc := range []struct {
		name string
		ins  []beacon.Instance
		want []string
	}{
		{"failing left out", []beacon.Instance{healthtest.Passing(one), healthtest.Failing(two, "x"), healthtest.Unknown(three)}, []string{a, c}},
		{"panic served", []beacon.Instance{healthtest.Passing(one), healthtest.Panic(two, "x"), healthtest.Panic(three, "x")}, []string{a, b, c}},
		{"all failing", []beacon.Instance{healthtest.Failing(one, "x")}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for name, p := range map[string]registry.Picker{
				"round-robin": registry.NewRoundRobin(tc.ins),
				"random":      registry.NewRandom(tc.ins),
				"p2c":         registry.NewP2C(tc.ins, func(beacon.Instance) float64 { return 0 }),
			} {
				if got := picked(t, p, 200); !equalSet(got, tc.want) {
					t.Errorf("%s picked %v, want %v", name, got, tc.want)
				}
			}
		})
	}
}

// TestFollowLeavesOutFailing: pickers fed by a watch (Follow) drop an
// instance when its check fails and take it back when it passes.
func TestFollowLeavesOutFailing(t *testing.T) {
	ctx, r := setup(t)
	r.Put(t, healthtest.Passing(inst(a, "10.0.0.1:80")), healthtest.Passing(inst(b, "10.0.0.2:80")),
		healthtest.Passing(inst(c, "10.0.0.3:80")))
	w, err := r.Watch(ctx, beacon.Query{Namespace: "demo"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	p := &notifyPicker{Picker: registry.NewRoundRobin(nil), updated: make(chan struct{}, 1)}
	fctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- registry.Follow(fctx, w, p) }()
	defer func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Follow: %v", err)
		}
	}()
	waitPicks(ctx, t, p, a, b, c)
	r.Put(t, healthtest.Failing(inst(b, "10.0.0.2:80"), "refused"))
	waitPicks(ctx, t, p, a, c)
	r.Put(t, healthtest.Passing(inst(b, "10.0.0.2:80")))
	waitPicks(ctx, t, p, a, b, c)
}

// waitPicks waits, at each update of p, until p picks exactly ids.
func waitPicks(ctx context.Context, t *testing.T, p *notifyPicker, ids ...string) {
	t.Helper()
	for !equalSet(picked(t, p, 30), ids) {
		select {
		case <-p.updated:
		case <-ctx.Done():
			t.Fatalf("the picker never picked exactly %v (last %v)", ids, picked(t, p, 30))
		}
	}
}

// picked returns the IDs n picks of p return, each once.
func picked(t *testing.T, p registry.Picker, n int) []string {
	t.Helper()
	seen := map[string]bool{}
	var out []string
	for range n {
		in, err := p.Pick()
		if errors.Is(err, registry.ErrNoInstances) {
			return nil
		}
		if err != nil {
			t.Fatal(err)
		}
		if !seen[in.ID] {
			seen[in.ID] = true
			out = append(out, in.ID)
		}
	}
	return out
}

func equalSet(got, want []string) bool {
	if len(got) != len(want) {
		return false
	}
	m := map[string]bool{}
	for _, s := range got {
		m[s] = true
	}
	for _, s := range want {
		if !m[s] {
			return false
		}
	}
	return true
}

// notifyPicker signals every Update it passes on to its Picker.
type notifyPicker struct {
	registry.Picker
	updated chan struct{}
}

func (n *notifyPicker) Update(ins []beacon.Instance) {
	n.Picker.Update(ins)
	select {
	case n.updated <- struct{}{}:
	default:
	}
}
