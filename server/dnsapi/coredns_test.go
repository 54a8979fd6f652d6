package dnsapi

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"github.com/beaconplane/beacon/internal/testkit/testpeer"
	"github.com/beaconplane/beacon/registry"
)

// startCoreDNS runs CoreDNS (built by .ci/build-peers) with the Corefile
// that a Kubernetes cluster would use for Beacon's zone: a stub domain
// forwarded to Beacon. No cache plugin, so that each answer is Beacon's.
func startCoreDNS(t *testing.T, beaconAddr string) string {
	t.Helper()
	return runCoreDNS(t, func(port int) string {
		return fmt.Sprintf(`beacon:%d {
    bind 127.0.0.1
    errors
    forward . %s
}
`, port, beaconAddr)
	})
}

// runCoreDNS runs CoreDNS with the Corefile that corefile returns for a
// free port, and returns its address.
func runCoreDNS(t *testing.T, corefile func(port int) string) string {
	t.Helper()
	bin := testpeer.Built(t, "coredns")
	port, err := etcdtest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	conf := filepath.Join(dir, "Corefile")
	if err := os.WriteFile(conf, []byte(corefile(port)), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := testpeer.Command(bin, "-conf", conf)
	out := &lockedOutput{want: "CoreDNS-", seen: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("coredns output:\n%s", out.String())
		}
	})
	// CoreDNS prints its version once every server block listens.
	select {
	case <-out.seen:
	case <-exited:
		t.Fatalf("coredns exited:\n%s", out.String())
	case <-time.After(testDeadline):
		t.Fatalf("coredns not serving after %v:\n%s", testDeadline, out.String())
	}
	return fmt.Sprintf("127.0.0.1:%d", port)
}

// CoreDNS forwarding the beacon. zone to Beacon, the way a Kubernetes
// cluster's DNS would: register -> resolvable, drain -> gone, large answers
// complete over TCP, negative answers pass through.
func TestCoreDNSStubDomain(t *testing.T) {
	t.Parallel()
	r := memRegistry(t)
	s, addr := startDNS(t, r, Config{})
	core := startCoreDNS(t, addr)

	reg := register(t, r, testInstance("web", "10.0.0.1:8080"))
	register(t, r, testInstance("web", "10.0.0.2:8080"))
	waitView(t, s, "two instances", func() bool { v := s.view.Load(); return v != nil && v.zone.instances == 2 })
	a := dig(t, core, "web.api.prod.beacon.", "A")
	if got := sorted(a.rdata("A")); !slices.Equal(got, []string{"10.0.0.1", "10.0.0.2"}) {
		t.Fatalf("A through CoreDNS = %v\n%s", got, a.raw)
	}
	res := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, core)
	}}
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	defer cancel()
	if _, srvs, err := res.LookupSRV(ctx, "web", "tcp", "api.prod.beacon"); err != nil || len(srvs) != 2 {
		t.Errorf("Go resolver through CoreDNS: LookupSRV = %v, %v", srvs, err)
	}
	if got := dig(t, core, "nope.api.prod.beacon.", "A"); got.status != "NXDOMAIN" || len(got.authority) != 1 {
		t.Errorf("absent name through CoreDNS: %s, authority %v", got.status, got.authority)
	}

	// Drain: gone for new lookups while the instance is still registered.
	drainCtx, stopDrain := context.WithCancel(context.Background())
	drained := make(chan error, 1)
	go func() { drained <- reg.Drain(drainCtx, registry.DrainGrace(time.Hour)) }()
	waitView(t, s, "the draining instance to leave DNS", func() bool { v := s.view.Load(); return v.zone.instances == 1 })
	ins, _, err := r.List(ctx, beacon.Query{Namespace: "prod"})
	if err != nil || len(ins) != 2 {
		t.Fatalf("List while draining: %d instances, %v", len(ins), err)
	}
	if got := dig(t, core, "web.api.prod.beacon.", "A").rdata("A"); !slices.Equal(got, []string{"10.0.0.2"}) {
		t.Errorf("A through CoreDNS while one instance drains = %v, want only 10.0.0.2", got)
	}
	if got := dig(t, core, reg.Instance().ID+".web.api.prod.beacon.", "A"); got.status != "NXDOMAIN" {
		t.Errorf("the draining instance's own name: %s, want NXDOMAIN", got.status)
	}
	stopDrain()
	if err := <-drained; err != nil {
		t.Errorf("Drain: %v", err)
	}

	// A large SRV set: truncated over UDP, complete over TCP through CoreDNS.
	for i := range 60 {
		register(t, r, testInstance("big", fmt.Sprintf("10.2.0.%d:9000", i+1)))
	}
	waitView(t, s, "61 instances", func() bool { v := s.view.Load(); return v.zone.instances == 61 })
	if got := dig(t, core, "+tcp", "big.api.prod.beacon.", "SRV"); len(got.rdata("SRV")) != 60 {
		t.Errorf("SRV over TCP through CoreDNS: %d records, want 60\n%s", len(got.rdata("SRV")), got.raw)
	}
	if got := dig(t, core, "+noedns", "+ignore", "big.api.prod.beacon.", "SRV"); !got.hasFlag("tc") {
		t.Errorf("SRV of 60 over UDP without EDNS through CoreDNS: flags %v, want tc", got.flags)
	}
}

// docsStubDomain returns the CoreDNS server block of docs/dns.md, for port,
// forwarding to upstreams, and listening on loopback only.
func docsStubDomain(t *testing.T, port int, upstreams ...string) string {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "dns.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(doc), "```\nbeacon:53 {\n")
	block, _, ok2 := strings.Cut(block, "```")
	if !ok || !ok2 || !strings.Contains(block, "forward . 10.96.0.53:9353") {
		t.Fatal("docs/dns.md: no CoreDNS block `beacon:53 { ... forward . 10.96.0.53:9353 ... }`")
	}
	block = strings.Replace(block, "forward . 10.96.0.53:9353", "forward . "+strings.Join(upstreams, " "), 1)
	return fmt.Sprintf("beacon:%d {\n    bind 127.0.0.1\n%s", port, block)
}

// The stub domain exactly as docs/dns.md gives it, in front of two Beacon
// servers of which one answers SERVFAIL (its view went stale): every name
// resolves after a few retries, because the block does not cache SERVFAIL
// (CoreDNS's cache does for 5 s by default, so a name whose first query hit
// the stale server would fail for 5 s whatever the retries).
func TestCoreDNSDocumentedStubDomain(t *testing.T) {
	t.Parallel()
	r := memRegistry(t)
	good, goodAddr := startDNS(t, r, Config{})
	broken := memRegistry(t)
	bad, badAddr := startDNS(t, broken, Config{MaxStale: -1})
	waitView(t, bad, "the second server's first snapshot", bad.Ready)
	if err := broken.Close(); err != nil {
		t.Fatal(err)
	}
	waitView(t, bad, "the second server's view to go stale", func() bool { return bad.current() == nil })
	core := runCoreDNS(t, func(port int) string { return docsStubDomain(t, port, goodAddr, badAddr) })

	const names = 10
	for i := range names {
		register(t, r, testInstance(fmt.Sprintf("e%d", i), fmt.Sprintf("10.0.0.%d:80", i+1)))
	}
	waitView(t, good, "the instances", func() bool { v := good.view.Load(); return v != nil && v.zone.instances == names })
	servfails := 0
	for i := range names {
		name := fmt.Sprintf("e%d.api.prod.beacon.", i)
		var statuses []string
		for len(statuses) < 64 {
			st := dig(t, core, name, "A").status
			statuses = append(statuses, st)
			if st == "NOERROR" {
				break
			}
			if st != "SERVFAIL" {
				t.Fatalf("%s through CoreDNS: %v", name, statuses)
			}
			servfails++
		}
		if statuses[len(statuses)-1] != "NOERROR" {
			t.Fatalf("%s through the documented stub domain: %d queries, never NOERROR (SERVFAIL cached?)", name, len(statuses))
		}
	}
	t.Logf("%d names resolved through the documented block, after %d SERVFAILs from the stale server", names, servfails)
	// Go's resolver, once CoreDNS holds the answer.
	res := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, core)
	}}
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	defer cancel()
	if addrs, err := res.LookupHost(ctx, "e0.api.prod.beacon"); err != nil || !slices.Equal(addrs, []string{"10.0.0.1"}) {
		t.Errorf("Go resolver through the documented stub domain: %v, %v", addrs, err)
	}
}
