package dnsapi

import (
	"context"
	"errors"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/testkit/healthtest"
	"github.com/beaconplane/beacon/internal/testkit/testpeer"
	"github.com/beaconplane/beacon/registry"
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
)

// testDeadline bounds every wait of a test.
const testDeadline = 30 * time.Second

// memRegistry is a registry over the memory backend, closed with the test.
func memRegistry(t testing.TB) *registry.StoreRegistry {
	t.Helper()
	return healthtest.NewRegistry(t).StoreRegistry
}

// startDNS serves d on loopback UDP and TCP ports chosen by the kernel and
// returns the server and its address; it is closed with the test.
func startDNS(t testing.TB, d registry.Discoverer, cfg Config) (*Server, string) {
	t.Helper()
	if cfg.Metrics == nil {
		cfg.Metrics = prometheus.NewRegistry()
	}
	s, err := New(d, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	pc, ln, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := s.Serve(pc, ln); err != nil {
		t.Fatal(err)
	}
	return s, addr
}

// waitView waits until cond holds, re-checking at each change of the DNS
// view (no sleeping), for at most testDeadline.
func waitView(t testing.TB, s *Server, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(testDeadline)
	defer deadline.Stop()
	for {
		ch := s.Updated()
		if cond() {
			return
		}
		select {
		case <-ch:
		case <-deadline.C:
			t.Fatalf("timed out after %v waiting for %s", testDeadline, what)
		}
	}
}

// query sends one question over net ("udp" or "tcp") with miekg/dns's
// client and returns the reply.
func query(t testing.TB, addr, network, name string, qtype uint16, edns int) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	m.RecursionDesired = false
	if edns > 0 {
		m.SetEdns0(uint16(edns), false)
	}
	c := &dns.Client{Net: network, Timeout: 5 * time.Second, UDPSize: uint16(max(edns, 512))}
	r, _, err := c.Exchange(m, addr)
	if err != nil {
		t.Fatalf("query %s %s over %s: %v", name, dns.TypeToString[qtype], network, err)
	}
	return r
}

func register(t testing.TB, r registry.Registry, in beacon.Instance) registry.Registration {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	defer cancel()
	reg, err := r.Register(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

// digResult is what dig printed for one query.
type digResult struct {
	status    string   // NOERROR, NXDOMAIN, ...
	flags     []string // qr aa tc ...
	answer    []string // "name ttl class type rdata", whitespace-normalized
	authority []string
	raw       string
}

func (r digResult) hasFlag(f string) bool {
	for _, x := range r.flags {
		if x == f {
			return true
		}
	}
	return false
}

// rdata returns the rdata of the answer records of type t.
func (r digResult) rdata(t string) []string {
	var out []string
	for _, l := range r.answer {
		f := strings.Fields(l)
		if len(f) >= 5 && f[3] == t {
			out = append(out, strings.Join(f[4:], " "))
		}
	}
	return out
}

var (
	digStatus = regexp.MustCompile(`status: ([A-Z]+)`)
	digFlags  = regexp.MustCompile(`;; flags: ([a-z ]+);`)
)

// dig runs Debian's dig against addr (host:port) and parses its answer.
func dig(t testing.TB, addr string, args ...string) digResult {
	t.Helper()
	bin := testpeer.Binary(t, "apt-get install bind9-dnsutils", "dig")
	host, port, _ := strings.Cut(addr, ":")
	full := append([]string{"@" + host, "-p", port, "+norecurse", "+time=5", "+tries=1", "+nocookie", "+noall", "+comments", "+answer", "+authority"}, args...)
	out, err := testpeer.Command(bin, full...).CombinedOutput()
	if err != nil {
		t.Fatalf("dig %s: %v\n%s", strings.Join(full, " "), err, out)
	}
	res := digResult{raw: string(out)}
	if m := digStatus.FindStringSubmatch(res.raw); m != nil {
		res.status = m[1]
	}
	if m := digFlags.FindStringSubmatch(res.raw); m != nil {
		res.flags = strings.Fields(m[1])
	}
	section := ""
	for _, l := range strings.Split(res.raw, "\n") {
		switch {
		case strings.HasPrefix(l, ";; ANSWER SECTION"):
			section = "answer"
		case strings.HasPrefix(l, ";; AUTHORITY SECTION"):
			section = "authority"
		case strings.HasPrefix(l, ";"), strings.TrimSpace(l) == "":
			if strings.TrimSpace(l) == "" {
				section = ""
			}
		default:
			line := strings.Join(strings.Fields(l), " ")
			switch section {
			case "answer":
				res.answer = append(res.answer, line)
			case "authority":
				res.authority = append(res.authority, line)
			}
		}
	}
	if res.status == "" {
		t.Fatalf("dig %s: no status in output:\n%s", strings.Join(full, " "), out)
	}
	return res
}

func errorsAs(err error, target any) bool { return errors.As(err, target) }

// testInstance is an instance of prod/api/<endpoint>.
func testInstance(endpoint, addr string) beacon.Instance {
	return beacon.Instance{Namespace: "prod", Component: "api", Endpoint: endpoint, Address: addr}
}

// lockedOutput collects a child process's output, and closes seen once
// the output holds want.
type lockedOutput struct {
	mu   sync.Mutex
	b    strings.Builder
	want string
	seen chan struct{}
}

func (l *lockedOutput) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n, err := l.b.Write(p)
	if l.want != "" && strings.Contains(l.b.String(), l.want) {
		close(l.seen)
		l.want = ""
	}
	return n, err
}

func (l *lockedOutput) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
