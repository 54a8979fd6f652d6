package proxy

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"slices"
	"testing"
	"time"
)

func TestConfigDefaults(t *testing.T) {
	t.Parallel()
	c := Config{}.withDefaults()
	if c.Mode != ReadWrite || c.ListenAddr != DefaultListenAddr || !slices.Equal(c.PeerURLs, []string{DefaultPeerURL}) ||
		c.FailureWait != 5*time.Second || c.RefreshInterval != 30*time.Second || c.DialTimeout != time.Second ||
		c.WriteTimeout != 5*time.Second || c.ReadTimeout != 0 || c.UpstreamConns != DefaultUpstreamConns {
		t.Fatalf("defaults: %+v", c)
	}
	if err := (Config{}).Validate(); err != nil {
		t.Fatalf("zero Config: %v", err)
	}
	c = Config{Endpoints: []string{"http://127.0.0.1:2379"}}.withDefaults()
	if len(c.PeerURLs) != 0 {
		t.Fatalf("default peer URL added beside endpoints: %v", c.PeerURLs)
	}
	// A negative StartTimeout is no bound (beacon proxy --start-timeout 0).
	if c := (Config{StartTimeout: -1}); c.Validate() != nil || c.withDefaults().StartTimeout != -1 {
		t.Fatalf("StartTimeout -1: %v, %v", c.Validate(), c.withDefaults().StartTimeout)
	}
	if err := (Config{DiscoveryToken: "bad token!", DiscoveryEndpoints: []string{"http://x:1"}}).Validate(); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("bad token: %v", err)
	}
}

func TestSelfMatcher(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	loop := newSelfMatcher(&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 23790}, []string{"http://proxy.example:9999"})
	all := newSelfMatcher(&net.TCPAddr{IP: net.IPv4zero, Port: 23790}, nil)
	other := newSelfMatcher(&net.TCPAddr{IP: net.IPv4(10, 9, 8, 7), Port: 23790}, nil)
	cases := []struct {
		m    *selfMatcher
		addr string
		want bool
	}{
		{loop, "127.0.0.1:23790", true},
		{loop, "localhost:23790", true},
		{loop, "[::1]:23790", true},
		{loop, "127.0.0.1:2379", false},
		{loop, "10.0.0.1:23790", false},
		{loop, "proxy.example:9999", true},
		{loop, "PROXY.example.:9999", true},
		{all, "127.0.0.1:23790", true},
		{all, "localhost:23790", true},
		{all, "127.0.0.1:2379", false},
		{other, "10.9.8.7:23790", true},
		{other, "127.0.0.1:23790", false},
		{other, "no-port", false},
	}
	for _, tc := range cases {
		if got := tc.m.isSelf(ctx, tc.addr); got != tc.want {
			t.Errorf("isSelf(%q) = %v, want %v", tc.addr, got, tc.want)
		}
	}
}

func TestDirectorBenchAndReturn(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	d := newDirector(5*time.Second, slog.New(slog.DiscardHandler), nil)
	d.now = func() time.Time { return now }
	var applied [][]string
	d.set = func(eps []string) { applied = append(applied, slices.Sorted(slices.Values(eps))) }
	d.replace([]*endpoint{
		{url: "http://a:1", hostport: "a:1", addr: "10.0.0.1:1"},
		{url: "http://b:1", hostport: "b:1", addr: "10.0.0.2:1"},
		{url: "http://self:1", hostport: "self:1", self: true},
	})
	if d.availableCount() != 2 || d.knownCount() != 2 {
		t.Fatalf("available %d known %d", d.availableCount(), d.knownCount())
	}
	if !d.fail("10.0.0.1:1", errors.New("boom")) {
		t.Fatal("fail by resolved address did not bench")
	}
	if d.fail("10.0.0.1:1", nil) {
		t.Fatal("benched twice")
	}
	if got := d.available(); !slices.Equal(got, []string{"http://b:1"}) {
		t.Fatalf("available after failure: %v", got)
	}
	if w := d.nextWake(); !w.Equal(now.Add(5 * time.Second)) {
		t.Fatalf("next wake %v", w)
	}
	// A refresh keeps the bench.
	d.replace([]*endpoint{{url: "http://a:1", hostport: "a:1"}, {url: "http://b:1", hostport: "b:1"}})
	if d.availableCount() != 1 {
		t.Fatalf("refresh reset the bench: %v", d.available())
	}
	now = now.Add(5 * time.Second)
	d.apply()
	if d.availableCount() != 2 {
		t.Fatalf("endpoint not back after the failure wait: %v", d.available())
	}
	d.markLoop("b:1")
	if got := d.available(); !slices.Equal(got, []string{"http://a:1"}) {
		t.Fatalf("after loop mark: %v", got)
	}
	want := [][]string{{"http://b:1"}, {"http://a:1", "http://b:1"}, {"http://a:1"}}
	if !slices.EqualFunc(applied[len(applied)-3:], want, slices.Equal) {
		t.Fatalf("endpoint sets handed to the client: %v", applied)
	}
	st := d.status()
	if len(st) != 2 {
		t.Fatalf("status: %+v", st)
	}
}

func TestCloseIdempotent(t *testing.T) {
	t.Parallel()
	p, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Serve(context.Background(), l); !errors.Is(err, ErrClosed) {
		t.Fatalf("Serve after Close: %v", err)
	}
	// Close while still looking for the cluster ends Serve promptly.
	q, err := New(Config{PeerURLs: []string{"http://127.0.0.1:1"}})
	if err != nil {
		t.Fatal(err)
	}
	l2 := mustListen(t)
	errc := make(chan error, 1)
	go func() { errc <- q.Serve(context.Background(), l2) }()
	eventually(t, "serving started", func() bool { return q.Addr() != nil })
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if err != nil {
			t.Fatalf("Serve stopped by Close while starting: %v, want nil", err)
		}
	case <-time.After(testTimeout):
		t.Fatal("Serve did not return after Close")
	}
	if err := q.Serve(context.Background(), mustListen(t)); !errors.Is(err, ErrClosed) && !errors.Is(err, ErrServing) {
		t.Fatalf("second Serve: %v", err)
	}
}

// TestFailLogBoundsRetryLines: a failure retried every 100 ms for a minute
// is one WARN, a WARN summary every failLogEvery and the rest DEBUG, and
// its end is reported once; a new run starts with a WARN again.
func TestFailLogBoundsRetryLines(t *testing.T) {
	t.Parallel()
	f := newFailLog()
	now := time.Unix(1000, 0)
	f.now = func() time.Time { return now }
	count := map[slog.Level]int{}
	for range 600 {
		lvl, _ := f.failed()
		count[lvl]++
		now = now.Add(100 * time.Millisecond)
	}
	// 60 s: the first WARN, then one at 10, 20, ... 50 s.
	if count[slog.LevelWarn] != 6 || count[slog.LevelDebug] != 600-6 {
		t.Fatalf("levels: %v", count)
	}
	if attrs, ok := f.ok(); !ok || !slices.Contains(attrs, any(600)) {
		t.Fatalf("end of the run: %v %v", attrs, ok)
	}
	if _, ok := f.ok(); ok {
		t.Fatal("an end reported without a run")
	}
	if lvl, _ := f.failed(); lvl != slog.LevelWarn {
		t.Fatalf("a new run of failures starts at %v", lvl)
	}
}

// TestOnceLogWarnsOncePerSubject: the same problem with the same endpoint
// is a WARN once, DEBUG after; another endpoint gets its own WARN.
func TestOnceLogWarnsOncePerSubject(t *testing.T) {
	t.Parallel()
	o := newOnceLog()
	var got []slog.Level
	for range 2 {
		got = append(got, o.level("self", "http://a"), o.level("self", "http://b"), o.level("malformed", "http://a"))
	}
	w, d := slog.LevelWarn, slog.LevelDebug
	if want := []slog.Level{w, w, w, d, d, d}; !slices.Equal(got, want) {
		t.Fatalf("levels %v, want %v", got, want)
	}
}

// TestAddrsSkipsEndpointsWithoutAHost: an endpoint the pool cannot dial
// by host and port (no host in its URL) is left out, not dialled as "".
func TestAddrsSkipsEndpointsWithoutAHost(t *testing.T) {
	got := addrs([]string{"http://127.0.0.1:2379", "unix:///tmp/etcd.sock", "localhost:2379", "https://etcd-1:2379"})
	var names []string
	for _, a := range got {
		names = append(names, a.Addr+"/"+a.ServerName)
	}
	if want := []string{"127.0.0.1:2379/127.0.0.1", "etcd-1:2379/etcd-1"}; !slices.Equal(names, want) {
		t.Fatalf("addresses %v, want %v", names, want)
	}
}
