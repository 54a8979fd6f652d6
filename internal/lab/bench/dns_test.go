package bench

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/testkit/machine"
	"github.com/beaconplane/beacon/internal/testkit/testpeer"
)

// TestRunDNSSmall runs the DNS scenario at a tiny size against the real
// peers: every row is there, both servers answered every query.
func TestRunDNSSmall(t *testing.T) {
	machine.Exclusive(t)
	cfg := DNSConfig{
		Instances: 3, Duration: time.Second, Rounds: 1, Clients: 2, Outstanding: 20, Trials: 3,
		CoreDNS: testpeer.Built(t, "coredns"),
		DNSPerf: testpeer.Binary(t, "apt-get install dnsperf", "dnsperf"),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r, err := RunDNS(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := r.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"coredns etcd", "queries/s", "latency p99", "freshness p50", "0 queries lost, 0 answers not NOERROR"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
	}
	for _, row := range r.Rows {
		if row.Beacon <= 0 || row.Baseline <= 0 {
			t.Errorf("%s: beacon %v, coredns %v", row.Metric, row.Beacon, row.Baseline)
		}
	}
}

// An interrupted run returns, and leaves no CoreDNS behind.
func TestRunDNSInterrupted(t *testing.T) {
	h := &pidHandler{started: make(chan int, 1)}
	cfg := DNSConfig{
		Instances: 2, Duration: time.Minute, Rounds: 1, Trials: 1, Logger: slog.New(h),
		CoreDNS: testpeer.Built(t, "coredns"),
		DNSPerf: testpeer.Binary(t, "apt-get install dnsperf", "dnsperf"),
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := RunDNS(ctx, cfg); done <- err }()
	var pid int
	select {
	case pid = <-h.started:
	case err := <-done:
		t.Fatalf("RunDNS ended before starting CoreDNS: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("CoreDNS never started")
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("interrupted run: %v, want context.Canceled", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("RunDNS did not return after its context was cancelled")
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("CoreDNS (pid %d) still exists after an interrupted run: %v", pid, err)
	}
}

// pidHandler reports the pid of the "coredns started" log record.
type pidHandler struct {
	started chan int
	once    sync.Once
}

func (h *pidHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *pidHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *pidHandler) WithGroup(string) slog.Handler            { return h }
func (h *pidHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "coredns started" {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "pid" {
			h.once.Do(func() { h.started <- int(a.Value.Int64()) })
		}
		return true
	})
	return nil
}

func TestParseDNSPerf(t *testing.T) {
	out := `DNS Performance Testing Tool
[Status] Sending queries (to 127.0.0.1:9353)
> NOERROR web.api.bench.beacon A 0.000278
> NOERROR web.api.bench.beacon SRV 0.000094
> SERVFAIL web.api.bench.beacon A 0.001000
[Timeout] Query timed out: msg id 5
Statistics:

  Queries sent:         4
  Queries completed:    3 (75.00%)
  Queries lost:         1 (25.00%)

  Response codes:       NOERROR 2 (66.67%), SERVFAIL 1 (33.33%)
  Queries per second:   69183.750960
`
	r, err := parseDNSPerf(strings.NewReader(out))
	if err != nil {
		t.Fatal(err)
	}
	if r.qps != 69183.750960 || r.lost != 1 || r.notNoError != 1 || len(r.latencies) != 3 || r.percentile(50) != 278*time.Microsecond {
		t.Errorf("parsed %+v", r)
	}
}
