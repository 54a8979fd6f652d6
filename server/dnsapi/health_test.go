package dnsapi

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/testkit/healthtest"
)

// TestDigLeavesOutFailing: an instance whose health check fails is left
// out of every name, as a draining one; passing again, it is back. Passing,
// unknown (no verdict yet) and unchecked instances are answered, and so are
// the failing instances of a service in panic.
func TestDigLeavesOutFailing(t *testing.T) {
	t.Parallel()
	r := healthtest.NewRegistry(t)
	put := func(ins ...beacon.Instance) { t.Helper(); r.Put(t, ins...) }
	at := func(ep, id, addr string) beacon.Instance {
		in := testInstance(ep, addr)
		in.ID, in.RegisteredAt = id, time.Now().UTC()
		return in
	}
	w1, w2, w3, w4 := at("web", "00000000000000a1", "10.0.0.1:80"), at("web", "00000000000000a2", "10.0.0.2:80"),
		at("web", "00000000000000a3", "10.0.0.3:80"), at("web", "00000000000000a4", "10.0.0.4:80")
	// prod/api/grpc: two of three failing, more than half: in panic.
	g1, g2, g3 := at("grpc", "00000000000000b1", "10.0.1.1:90"), at("grpc", "00000000000000b2", "10.0.1.2:90"),
		at("grpc", "00000000000000b3", "10.0.1.3:90")
	put(healthtest.Passing(w1), healthtest.Failing(w2, "connection refused"), healthtest.Unknown(w3), w4,
		healthtest.Passing(g1), healthtest.Panic(g2, "timeout"), healthtest.Panic(g3, "timeout"))
	s, addr := startDNS(t, r.StoreRegistry, Config{})
	waitView(t, s, "6 instances answered", func() bool {
		v := s.view.Load()
		return v != nil && v.zone.instances == 6
	})

	if got := sorted(dig(t, addr, "web.api.prod.beacon.", "A").rdata("A")); !slices.Equal(got, []string{"10.0.0.1", "10.0.0.3", "10.0.0.4"}) {
		t.Errorf("A web.api.prod.beacon. = %v, want every instance but the failing 10.0.0.2", got)
	}
	if got := dig(t, addr, "_web._tcp.api.prod.beacon.", "SRV").rdata("SRV"); len(got) != 3 {
		t.Errorf("SRV _web._tcp.api.prod.beacon. = %v, want 3 records", got)
	}
	if got := dig(t, addr, "00000000000000a2.web.api.prod.beacon.", "A"); got.status != "NXDOMAIN" {
		t.Errorf("A of the failing instance's own name: %s %v, want NXDOMAIN\n%s", got.status, got.answer, got.raw)
	}
	if got := sorted(dig(t, addr, "grpc.api.prod.beacon.", "A").rdata("A")); !slices.Equal(got, []string{"10.0.1.1", "10.0.1.2", "10.0.1.3"}) {
		t.Errorf("A grpc.api.prod.beacon. = %v, want all three (the service is in panic)", got)
	}

	put(healthtest.Passing(w2))
	waitView(t, s, "7 instances answered", func() bool { return s.view.Load().zone.instances == 7 })
	if got := sorted(dig(t, addr, "web.api.prod.beacon.", "A").rdata("A")); !slices.Equal(got, []string{"10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"}) {
		t.Errorf("A web.api.prod.beacon. = %v after the check passed again, want all four", got)
	}
}

// TestDigFailsOverWhenAPrimaryTierFails: panic is judged per priority. A
// whole primary tier failing (3 of 5 checked instances) while the backup
// tier at priority 20 passes is no panic: the primaries are left out, and
// the SRV answer is the backups, so resolvers fail over to them.
func TestDigFailsOverWhenAPrimaryTierFails(t *testing.T) {
	t.Parallel()
	r := healthtest.NewRegistry(t)
	at := func(id, addr, prio string) beacon.Instance {
		in := testInstance("grpc", addr)
		in.ID, in.RegisteredAt = id, time.Now().UTC()
		if prio != "" {
			in.Metadata = map[string]string{beacon.MetaPriority: prio}
		}
		return in
	}
	r.Put(t, healthtest.Failing(at("00000000000000c1", "10.0.2.1:90", ""), "NOT_SERVING"),
		healthtest.Failing(at("00000000000000c2", "10.0.2.2:90", ""), "NOT_SERVING"),
		healthtest.Failing(at("00000000000000c3", "10.0.2.3:90", ""), "NOT_SERVING"),
		healthtest.Passing(at("00000000000000c4", "10.0.2.4:90", "20")),
		healthtest.Passing(at("00000000000000c5", "10.0.2.5:90", "20")))
	s, addr := startDNS(t, r.StoreRegistry, Config{})
	waitView(t, s, "the 2 backups answered", func() bool {
		v := s.view.Load()
		return v != nil && v.zone.instances == 2
	})
	if got := sorted(dig(t, addr, "grpc.api.prod.beacon.", "A").rdata("A")); !slices.Equal(got, []string{"10.0.2.4", "10.0.2.5"}) {
		t.Errorf("A grpc.api.prod.beacon. = %v, want the backups only", got)
	}
	srv := dig(t, addr, "_grpc._tcp.api.prod.beacon.", "SRV").rdata("SRV")
	if len(srv) != 2 || !strings.HasPrefix(srv[0], "20 ") || !strings.HasPrefix(srv[1], "20 ") {
		t.Errorf("SRV _grpc._tcp.api.prod.beacon. = %v, want the 2 backups at priority 20", srv)
	}
}
