package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon/bootstrap"
	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"github.com/miekg/dns"
)

// memberRefresh is how often the discovery tests' proxies read the member
// list again: a member that has not published its client URLs when the
// proxy first reads the list (a loaded machine) is found at the next read.
const memberRefresh = 200 * time.Millisecond

// waitEndpoints waits until p uses exactly the endpoints want (sorted).
func waitEndpoints(t *testing.T, p *Proxy, want []string) {
	t.Helper()
	eventually(t, fmt.Sprintf("the proxy to use the endpoints %v", want), func() bool {
		return slices.Equal(endpointURLs(p), want)
	})
}

func endpointURLs(p *Proxy) []string {
	var out []string
	for _, e := range p.Endpoints() {
		out = append(out, e.URL)
	}
	slices.Sort(out)
	return out
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// TestDiscoveryV3Token finds the cluster from a v3 discovery token, also
// when more members registered than the size (a full cluster).
func TestDiscoveryV3Token(t *testing.T) {
	t.Parallel()
	c := etcdtest.StartCluster(t, 3)
	disc := etcdtest.Start(t, etcdtest.Options{Name: "discovery"})
	ctx := ctxT(t)
	dcli := disc.Client(t)
	tok := "8A591FAB-1D72-41FA-BDF2-A27162FDA1E0"
	if _, err := dcli.Put(ctx, "/_etcd/registry/"+tok+"/_config/size", "3"); err != nil {
		t.Fatal(err)
	}
	for i, m := range c.Members() {
		if _, err := dcli.Put(ctx, fmt.Sprintf("/_etcd/registry/%s/members/%x", tok, 100+i), m.Name+"="+m.PeerURL()); err != nil {
			t.Fatal(err)
		}
	}
	// A fourth member found the cluster full; it must not be used.
	if _, err := dcli.Put(ctx, "/_etcd/registry/"+tok+"/members/1", "late=http://127.0.0.1:1"); err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, Config{DiscoveryToken: tok, DiscoveryEndpoints: disc.Endpoints(), RefreshInterval: memberRefresh})
	waitEndpoints(t, p, sorted(c.Endpoints()))
	cli := proxyClient(t, p)
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}

	// The same through a full bootstrap.Config (what beacon serve passes).
	q2 := startProxy(t, Config{Discovery: &bootstrap.Config{Token: tok, Endpoints: disc.Endpoints()}})
	if got, want := endpointURLs(q2), sorted(c.Endpoints()); !slices.Equal(got, want) {
		t.Fatalf("endpoints via Config.Discovery %v, want %v", got, want)
	}

	// A token without a size key fails at start, at once.
	q, err := New(Config{DiscoveryToken: "missing", DiscoveryEndpoints: disc.Endpoints()})
	if err != nil {
		t.Fatal(err)
	}
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	err = q.Serve(ctx, l)
	if !errors.Is(err, ErrSizeNotFound) || !errors.Is(err, bootstrap.ErrSizeNotFound) || !strings.Contains(err.Error(), "missing") ||
		strings.Count(err.Error(), "size key not found") != 1 {
		t.Fatalf("token without size: %v, want ErrSizeNotFound naming the token, saying so once", err)
	}
}

// TestDiscoveryV2URL reads an etcd v2 discovery URL served by a real etcd
// v2 keys API (Debian's etcd 3.4 with --enable-v2, like a self-hosted
// discovery registry).
func TestDiscoveryV2URL(t *testing.T) {
	t.Parallel()
	base := etcdtest.StartDebianEtcd(t, "--enable-v2=true")
	c := etcdtest.StartCluster(t, 3)
	tok := "6fa3e2c1b0d94e8f9a7b5c4d3e2f1a0b"
	reg := base + "/v2/keys/_etcd/registry/" + tok
	v2put(t, reg+"/_config/size", "3")
	for i, m := range c.Members() {
		v2put(t, fmt.Sprintf("%s/%x", reg, 200+i), m.Name+"="+m.PeerURL())
	}
	v2put(t, reg+"/1", "late=http://127.0.0.1:1")
	p := startProxy(t, Config{DiscoveryURL: reg, RefreshInterval: memberRefresh})
	waitEndpoints(t, p, sorted(c.Endpoints()))
	q, err := New(Config{DiscoveryURL: base + "/v2/keys/_etcd/registry/nosuchtoken"})
	if err != nil {
		t.Fatal(err)
	}
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	if err := q.Serve(ctxT(t), l); !errors.Is(err, ErrSizeNotFound) {
		t.Fatalf("unknown v2 token: %v, want ErrSizeNotFound", err)
	}
}

func v2put(t *testing.T, u, value string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctxT(t), http.MethodPut, u, strings.NewReader(url.Values{"value": {value}}.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := httpClient(t).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Fatalf("PUT %s: %s", u, resp.Status)
	}
}

// TestDiscoverySRV finds the peers from SRV records served by a real DNS
// server (miekg/dns) on loopback.
func TestDiscoverySRV(t *testing.T) {
	t.Parallel()
	c := etcdtest.StartCluster(t, 3)
	records := map[string][]dns.RR{}
	add := func(s string) {
		rr, err := dns.NewRR(s)
		if err != nil {
			t.Fatal(err)
		}
		records[strings.ToLower(rr.Header().Name)] = append(records[strings.ToLower(rr.Header().Name)], rr)
	}
	for i, m := range c.Members() {
		u, _ := url.Parse(m.PeerURL())
		host := fmt.Sprintf("m%d.example.test.", i+1)
		add(fmt.Sprintf("_etcd-server._tcp.example.test. 60 IN SRV 0 0 %s %s", u.Port(), host))
		add(fmt.Sprintf("%s 60 IN A 127.0.0.1", host))
	}
	addr := startDNS(t, records)
	p := startProxy(t, Config{DiscoverySRV: "example.test", DNSServer: addr, RefreshInterval: memberRefresh})
	waitEndpoints(t, p, sorted(c.Endpoints()))
	peers, err := discoverSRV(ctxT(t), "nosuch.test", "", addr)
	if err == nil || !strings.Contains(err.Error(), "_etcd-server._tcp.nosuch.test") {
		t.Fatalf("missing SRV records: %v %v", peers, err)
	}
}

// startDNS serves records over UDP on loopback until the test ends.
func startDNS(t *testing.T, records map[string][]dns.RR) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := dns.NewServeMux()
	mux.HandleFunc(".", func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		for _, q := range r.Question {
			for _, rr := range records[strings.ToLower(q.Name)] {
				if rr.Header().Rrtype == q.Qtype {
					m.Answer = append(m.Answer, rr)
				}
			}
		}
		if len(m.Answer) == 0 {
			m.Rcode = dns.RcodeNameError
		}
		_ = w.WriteMsg(m)
	})
	started := make(chan struct{})
	srv := &dns.Server{PacketConn: pc, Handler: mux, NotifyStartedFunc: func() { close(started) }}
	done := make(chan error, 1)
	go func() { done <- srv.ActivateAndServe() }()
	<-started
	t.Cleanup(func() {
		_ = srv.Shutdown()
		<-done
	})
	return pc.LocalAddr().String()
}

// TestBadInputAtStart: configuration mistakes fail New or Serve with a
// clear error; nothing is served.
func TestBadInputAtStart(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		cfg  Config
		want error
		text string
	}{
		{"unknown mode", Config{Mode: "readmostly"}, ErrBadMode, "readmostly"},
		{"token and initial cluster", Config{DiscoveryToken: "t", DiscoveryEndpoints: []string{"http://127.0.0.1:2379"}, InitialCluster: "a=http://127.0.0.1:2380"}, ErrConflictingDiscovery, "only one"},
		{"srv and v2", Config{DiscoverySRV: "example.com", DiscoveryURL: "http://d/x"}, ErrConflictingDiscovery, "only one"},
		{"token without endpoints", Config{DiscoveryToken: "t"}, ErrInvalidConfig, "proxy.Config.DiscoveryEndpoints"},
		{"endpoints without token", Config{DiscoveryEndpoints: []string{"http://127.0.0.1:2379"}}, ErrInvalidConfig, "proxy.Config.DiscoveryToken"},
		{"malformed peer URL", Config{PeerURLs: []string{"127.0.0.1:2380"}}, ErrBadURL, "scheme"},
		{"peer URL without port", Config{PeerURLs: []string{"http://host"}}, ErrBadURL, "port"},
		{"bad initial cluster", Config{InitialCluster: "nonsense"}, ErrBadURL, "proxy.Config.InitialCluster"},
		{"bad v2 URL", Config{DiscoveryURL: "ftp://x/y"}, ErrBadURL, "proxy.Config.DiscoveryURL"},
		{"v2 URL without token", Config{DiscoveryURL: "https://discovery.etcd.io/"}, ErrBadURL, "token"},
		{"bad DNS server", Config{DiscoverySRV: "example.com", DNSServer: "localhost"}, ErrInvalidConfig, "host:port"},
		{"negative wait", Config{FailureWait: -time.Second}, ErrInvalidConfig, "proxy.Config.FailureWait"},
	}
	for _, tc := range cases {
		_, err := New(tc.cfg)
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.text) {
			t.Errorf("%s: New = %v, want %v mentioning %q", tc.name, err, tc.want, tc.text)
		}
	}

	// Unreachable member URLs: Serve fails within StartTimeout naming
	// what it tried.
	port, _ := etcdtest.FreePort()
	dead := "http://127.0.0.1:" + strconv.Itoa(port)
	p, err := New(Config{PeerURLs: []string{dead}, StartTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	err = p.Serve(context.Background(), l)
	if !errors.Is(err, ErrNoMembers) || !strings.Contains(err.Error(), dead) {
		t.Fatalf("unreachable peers: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
}
