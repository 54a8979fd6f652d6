package dnsapi

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store/etcd"
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
)

// etcdRegistry is a registry over a real etcd, closed with the test.
func etcdRegistry(t *testing.T, srv *etcdtest.Server) *registry.StoreRegistry {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	defer cancel()
	st, err := etcd.Open(ctx, etcd.Config{Endpoints: srv.Endpoints()})
	if err != nil {
		t.Fatal(err)
	}
	r, err := registry.New(st, registry.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = r.Close()
		_ = st.Close()
	})
	return r
}

// A registrant process killed with SIGKILL disappears from DNS once its
// lease expires: resolvable while it lives, NXDOMAIN after, from Beacon and
// through CoreDNS forwarding the zone to it.
func TestSIGKILLedRegistrantGoneAfterLease(t *testing.T) {
	t.Parallel()
	e := etcdtest.Start(t, etcdtest.Options{})
	s, addr := startDNS(t, etcdRegistry(t, e), Config{})
	core := startCoreDNS(t, addr) // and through CoreDNS, as a cluster would see it
	child, id := startChild(t, e.Endpoint())
	name := id + ".gen.worker.prod.beacon."

	waitView(t, s, "the child's instance", func() bool { return query(t, addr, "udp", name, dns.TypeA, 0).Rcode == dns.RcodeSuccess })
	for _, server := range []string{addr, core} {
		if got := dig(t, server, "gen.worker.prod.beacon.", "A").rdata("A"); len(got) != 1 || got[0] != "10.9.0.1" {
			t.Fatalf("A of the child's endpoint from %s = %v", server, got)
		}
	}
	killed := time.Now()
	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitView(t, s, "the killed child's instance to go", func() bool { return query(t, addr, "udp", name, dns.TypeA, 0).Rcode == dns.RcodeNameError })
	gone := time.Since(killed)
	for _, server := range []string{addr, core} {
		if res := dig(t, server, "gen.worker.prod.beacon.", "A"); res.status != "NXDOMAIN" {
			t.Errorf("endpoint after SIGKILL, from %s: %s %v, want NXDOMAIN", server, res.status, res.answer)
		}
	}
	t.Logf("gone from DNS %v after SIGKILL (lease TTL %v)", gone.Round(time.Millisecond), childTTL)
}

// While the watch is stale (etcd down), the last view is served for
// MaxStale, then names answer SERVFAIL; when etcd is back, answers are.
func TestStaleWatch(t *testing.T) {
	t.Parallel()
	e := etcdtest.Start(t, etcdtest.Options{})
	r := etcdRegistry(t, e)
	register(t, r, testInstance("web", "10.0.0.1:80"))
	metrics := prometheus.NewRegistry()
	strict, strictAddr := startDNS(t, r, Config{MaxStale: -1})
	lenient, lenientAddr := startDNS(t, r, Config{MaxStale: time.Hour, Metrics: metrics})
	const name = "web.api.prod.beacon."
	for _, s := range []*Server{strict, lenient} {
		waitView(t, s, "the instance", func() bool { v := s.view.Load(); return v != nil && v.zone.instances == 1 })
	}

	e.Stop()
	for _, s := range []*Server{strict, lenient} {
		waitView(t, s, "the watch to go stale", func() bool { v := s.view.Load(); return !v.staleSince.IsZero() })
	}
	if got := dig(t, strictAddr, name, "A"); got.status != "SERVFAIL" {
		t.Errorf("stale past the bound: %s, want SERVFAIL", got.status)
	}
	if got := dig(t, lenientAddr, name, "A"); got.status != "NOERROR" || len(got.answer) != 1 {
		t.Errorf("stale within the bound: %s %v, want the last view", got.status, got.answer)
	}
	if got := dig(t, strictAddr, "example.com.", "A"); got.status != "REFUSED" {
		t.Errorf("outside the domain while stale: %s, want REFUSED", got.status)
	}
	if v := metricValue(t, metrics, "beacon_dns_stale_seconds"); v <= 0 {
		t.Errorf("beacon_dns_stale_seconds = %v while stale", v)
	}

	if err := e.Restart(); err != nil {
		t.Fatal(err)
	}
	for _, s := range []*Server{strict, lenient} {
		waitView(t, s, "the watch to come back", func() bool { v := s.view.Load(); return v.staleSince.IsZero() })
	}
	if got := dig(t, strictAddr, name, "A"); got.status != "NOERROR" || len(got.answer) != 1 {
		t.Errorf("after etcd came back: %s %v", got.status, got.answer)
	}
}

// metricValue reads a gauge or counter without labels.
func metricValue(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			m := mf.GetMetric()[0]
			if m.GetGauge() != nil {
				return m.GetGauge().GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("metric %s not found", name)
	return 0
}
