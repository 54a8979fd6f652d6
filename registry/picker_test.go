package registry_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry"
)

func pickerInstances(n int) []beacon.Instance {
	out := make([]beacon.Instance, n)
	for i := range out {
		out[i] = inst("p", fmt.Sprintf("10.0.0.%d:80", i+1))
		out[i].ID = beacon.FormatID(uint64(i + 1))
	}
	return out
}

func TestRoundRobin(t *testing.T) {
	ins := pickerInstances(3)
	ins[1].Status = beacon.StatusDraining
	p := registry.NewRoundRobin(ins)
	var got []string
	for range 4 {
		in, err := p.Pick()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, in.Address)
	}
	want := []string{"10.0.0.1:80", "10.0.0.3:80", "10.0.0.1:80", "10.0.0.3:80"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("picked %v, want %v (draining skipped)", got, want)
	}
	p.Update(nil)
	if _, err := p.Pick(); !errors.Is(err, registry.ErrNoInstances) {
		t.Fatalf("empty picker: %v", err)
	}
}

func TestRandomCoversAll(t *testing.T) {
	p := registry.NewRandom(pickerInstances(4))
	seen := map[string]bool{}
	for range 1000 {
		in, err := p.Pick()
		if err != nil {
			t.Fatal(err)
		}
		seen[in.ID] = true
	}
	if len(seen) != 4 {
		t.Fatalf("random picker used %d of 4 instances in 1000 picks", len(seen))
	}
	if _, err := registry.NewRandom(nil).Pick(); !errors.Is(err, registry.ErrNoInstances) {
		t.Fatal(err)
	}
}

func TestP2CPrefersLessLoaded(t *testing.T) {
	ins := pickerInstances(10)
	var mu sync.Mutex
	load := map[string]float64{}
	for i, in := range ins {
		load[in.ID] = float64(i) // instance 1 idle, instance 10 busiest
	}
	p := registry.NewP2C(ins, func(in beacon.Instance) float64 {
		mu.Lock()
		defer mu.Unlock()
		return load[in.ID]
	})
	counts := map[string]int{}
	for range 10000 {
		in, err := p.Pick()
		if err != nil {
			t.Fatal(err)
		}
		counts[in.ID]++
	}
	// The busiest instance only wins if drawn with itself, which P2C never
	// does: it is never picked. The idlest wins every draw it is in.
	if counts[ins[9].ID] != 0 {
		t.Fatalf("busiest instance picked %d times", counts[ins[9].ID])
	}
	if counts[ins[0].ID] < counts[ins[5].ID] {
		t.Fatalf("idle instance picked %d times, a loaded one %d", counts[ins[0].ID], counts[ins[5].ID])
	}
	one := registry.NewP2C(ins[:1], func(beacon.Instance) float64 { return 0 })
	if in, err := one.Pick(); err != nil || in.ID != ins[0].ID {
		t.Fatalf("single instance: %v %v", in, err)
	}
}

// TestFollowFeedsPickers: Follow keeps pickers on a watcher's view.
func TestFollowFeedsPickers(t *testing.T) {
	st := newMemoryStore(t)
	r := newRegistry(t, st, registry.Config{})
	ns := uniqueNS()
	ctx := within(t, 30*time.Second)
	w, err := r.Watch(ctx, beacon.Query{Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	rr := registry.NewRoundRobin(nil)
	np := &notifyPicker{Picker: rr, updated: make(chan struct{}, 1)}
	fctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- registry.Follow(fctx, w, np) }()
	reg, err := r.Register(ctx, inst(ns, "10.0.0.1:80"))
	if err != nil {
		t.Fatal(err)
	}
	// Wait for the updates Follow makes, until the picker has the
	// registration (the first update may be the empty snapshot).
	for {
		if in, err := rr.Pick(); err == nil && in.ID == reg.Instance().ID {
			break
		}
		select {
		case <-np.updated:
		case <-ctx.Done():
			t.Fatal("the picker never saw the registration")
		}
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Follow returned %v", err)
	}
	// Local cancellation leaves the picker as it was.
	if _, err := rr.Pick(); err != nil {
		t.Fatalf("after Follow ended: %v", err)
	}
}

// notifyPicker signals every Update it passes on to its Picker.
type notifyPicker struct {
	registry.Picker
	updated chan struct{}
}

func (p *notifyPicker) Update(in []beacon.Instance) {
	p.Picker.Update(in)
	select {
	case p.updated <- struct{}{}:
	default:
	}
}
