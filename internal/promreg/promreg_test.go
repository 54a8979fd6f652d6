package promreg

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestRegisterSharesAndReports(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	opts := prometheus.CounterOpts{Name: "beacon_test_total", Help: "A test counter."}
	var err error
	first := Register(reg, prometheus.NewCounter(opts), &err)
	second := Register(reg, prometheus.NewCounter(opts), &err)
	if err != nil {
		t.Fatal(err)
	}
	if first != second {
		t.Fatal("a second identical collector was not replaced by the registered one")
	}
	// Same name, other help: a real conflict is reported, not hidden.
	Register(reg, prometheus.NewCounter(prometheus.CounterOpts{Name: "beacon_test_total", Help: "Other help."}), &err)
	if err == nil {
		t.Fatal("a conflicting collector registered without error")
	}
}

func TestFactoryRegistersSharesAndReports(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	f := With(reg)
	first := f.CounterVec("beacon_test_total", "A test counter.", "kind")
	second := With(reg).CounterVec("beacon_test_total", "A test counter.", "kind")
	if first != second {
		t.Fatal("a second factory's identical collector was not replaced by the registered one")
	}
	f.Gauge("beacon_test_total", "Other help.") // a real conflict
	if f.Err() == nil {
		t.Fatal("a conflicting collector registered without error")
	}
	h := f.Histogram("beacon_test_seconds", "A test histogram.", []float64{1, 2})
	h.Observe(1)
	first.WithLabelValues("x").Inc()
	if n, err := reg.Gather(); err != nil || len(n) != 2 {
		t.Fatalf("gathered %d families (%v), want the counter and the histogram", len(n), err)
	}

	unregistered := With(nil)
	unregistered.Counter("beacon_test_total", "Other help.").Inc() // works, exported nowhere
	if unregistered.Err() != nil {
		t.Fatal(unregistered.Err())
	}
}

func TestRegisterEachStopsAtTheFirstFailure(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	a := prometheus.NewCounter(prometheus.CounterOpts{Name: "beacon_a_total", Help: "A."})
	b := prometheus.NewCounter(prometheus.CounterOpts{Name: "beacon_b_total", Help: "B."})
	if err := RegisterEach(reg, a); err != nil {
		t.Fatal(err)
	}
	// Not shared: a collector already held is an error, and b is not registered after it.
	if err := RegisterEach(reg, a, b); err == nil {
		t.Fatal("registering a collector twice succeeded")
	}
	if reg.Unregister(b) {
		t.Fatal("a collector after the failure was registered")
	}
}

// TestFactoryWithoutRegistererKeepsWhatItMade: without a Registerer a
// Factory registers nothing and keeps every collector it made, in order,
// for a caller that registers them without sharing (RegisterEach).
func TestFactoryWithoutRegistererKeepsWhatItMade(t *testing.T) {
	f := With(nil)
	c := f.Counter("a_total", "a")
	g := f.GaugeFunc("b", "b", func() float64 { return 2 })
	made := f.Made()
	if len(made) != 2 || made[0] != prometheus.Collector(c) || made[1] != prometheus.Collector(g) {
		t.Fatalf("Made() = %v, want the counter then the gauge", made)
	}
	reg := prometheus.NewRegistry()
	if err := RegisterEach(reg, made...); err != nil {
		t.Fatal(err)
	}
	if err := RegisterEach(reg, With(nil).Made()...); err != nil {
		t.Fatalf("nothing to register: %v", err)
	}
	f2 := With(nil)
	f2.Counter("a_total", "a")
	if err := RegisterEach(reg, f2.Made()...); err == nil {
		t.Fatal("a second set of the same series registered: want an error, not sharing")
	}
	fr := With(prometheus.NewRegistry())
	fr.Counter("c_total", "c")
	if len(fr.Made()) != 0 {
		t.Fatal("a Factory with a Registerer kept what it made")
	}
}
