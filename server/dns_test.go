package server

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/backend"
	"github.com/miekg/dns"
)

// beacon serve answers DNS for what its registry holds, and counts the
// queries on /metrics.
func TestServeDNS(t *testing.T) {
	cfg := Config{HTTPAddr: "127.0.0.1:0", Backend: backend.Config{Name: backend.Memory},
		DNS: DNSConfig{Addr: "127.0.0.1:0", Domain: "svc.example", TTL: 7 * time.Second}}
	s := startServer(t, cfg)
	if !strings.Contains(s.Banner(), "DNS           "+s.DNSAddr()) || !strings.Contains(s.Banner(), "svc.example.") {
		t.Errorf("banner lacks DNS:\n%s", s.Banner())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	updated := s.DNS().Updated()
	if _, err := s.Registry().Register(ctx, beacon.Instance{Namespace: "prod", Component: "api", Endpoint: "web", Address: "10.0.0.1:80"}); err != nil {
		t.Fatal(err)
	}
	for {
		m := new(dns.Msg)
		m.SetQuestion("web.api.prod.svc.example.", dns.TypeA)
		r, _, err := (&dns.Client{Timeout: 5 * time.Second}).ExchangeContext(ctx, m, s.DNSAddr())
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Answer) == 1 {
			if r.Answer[0].Header().Ttl != 7 {
				t.Errorf("TTL %d, want --dns-ttl 7", r.Answer[0].Header().Ttl)
			}
			break
		}
		select {
		case <-updated:
			updated = s.DNS().Updated()
		case <-ctx.Done():
			t.Fatalf("never answered: %v", r)
		}
	}
	if code, body := get(t, s.Endpoints().HTTP+"/metrics"); code != 200 || !strings.Contains(body, `beacon_dns_queries_total{qtype="A",rcode="NOERROR"}`) || !strings.Contains(body, "beacon_dns_instances 1") {
		t.Errorf("/metrics lacks the DNS metrics (%d):\n%s", code, grepLines(body, "beacon_dns_"))
	}
}

// A server that says it is ready answers DNS: Start returns once DNS has
// the registry's first snapshot, so the zone's SOA answers NOERROR at once
// (not SERVFAIL), and /readyz reports DNS; over embedded etcd, as `beacon
// serve` runs by default.
func TestDNSAnswersOnceStarted(t *testing.T) {
	cfg := testConfig(t)
	cfg.DNS = DNSConfig{Addr: "127.0.0.1:0"}
	s := startServer(t, cfg)
	m := new(dns.Msg)
	m.SetQuestion("beacon.", dns.TypeSOA)
	r, _, err := (&dns.Client{Net: "tcp", Timeout: 5 * time.Second}).Exchange(m, s.DNSAddr())
	if err != nil || r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
		t.Fatalf("SOA right after Start: %v %v", r, err)
	}
	if code, body := get(t, s.Endpoints().HTTP+"/readyz"); code != 200 || !strings.Contains(body, `"dns":"ok"`) {
		t.Errorf("/readyz = %d %s", code, body)
	}
}

// A DNS port in use fails Start with advice, before anything is written;
// bad DNS settings fail New.
func TestDNSConfigErrors(t *testing.T) {
	ln, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dir := filepath.Join(t.TempDir(), "data")
	cfg := testConfig(t)
	cfg.DataDir = dir
	cfg.DNS.Addr = ln.LocalAddr().String()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = s.Start(context.Background())
	if err == nil || !strings.Contains(err.Error(), "Config.DNS.Addr") || !strings.Contains(err.Error(), "in use") {
		t.Errorf("Start with the DNS port taken: %v", err)
	}
	if _, statErr := os.Stat(dir); !os.IsNotExist(statErr) {
		t.Errorf("the data dir was created before the DNS port failed: %v", statErr)
	}
	for _, tc := range []struct {
		dns  DNSConfig
		want string
	}{
		{DNSConfig{Addr: "nope"}, "Config.DNS.Addr"},
		{DNSConfig{Addr: "127.0.0.1:0", Domain: "a..b"}, "dnsapi.Config.Domain"},
		{DNSConfig{Addr: "127.0.0.1:0", TTL: time.Millisecond}, "dnsapi.Config.TTL"},
		{DNSConfig{Domain: "a..b"}, ""}, // disabled: not checked
	} {
		c := Config{HTTPAddr: "127.0.0.1:0", Backend: backend.Config{Name: backend.Memory}, DNS: tc.dns}
		_, err := New(c)
		if (err == nil) != (tc.want == "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%+v: %v, want %q", tc.dns, err, tc.want)
		}
	}
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
