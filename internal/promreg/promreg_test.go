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
