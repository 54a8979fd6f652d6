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
