package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/testkit/healthtest"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store"
)

// reportRig is a registration with a TTL check on the memory backend, the
// ttlReports writing its reports from a pipe, and the reports the store
// got.
type reportRig struct {
	t      *testing.T
	st     store.Store
	key    string // the report's key
	lines  *io.PipeWriter
	events chan string // what the reports emitted
	seen   []string
}

func newReportRig(t *testing.T, ttl time.Duration) *reportRig {
	t.Helper()
	r := healthtest.NewRegistry(t)
	st := r.Store
	ctx := context.Background()
	reg, err := r.Register(ctx, beacon.Instance{Namespace: "prod", Component: "batch", Endpoint: "jobs", ID: "00000000000000e1",
		Address: "127.0.0.1:7000", Check: &beacon.Check{Kind: beacon.CheckTTL, TTL: ttl}})
	if err != nil {
		t.Fatal(err)
	}
	pr, pw := io.Pipe()
	rig := &reportRig{t: t, st: st, key: registry.ReportKey(r.Keyspace(), reg.Instance().Ref()), lines: pw, events: make(chan string, 100)}
	emit := func(l registerLine, text string) { rig.events <- l.Event + ": " + text }
	rep := &ttlReports{rep: r, ref: reg.Instance().Ref(), ttl: ttl, in: pr, emit: emit, log: slog.New(slog.DiscardHandler),
		bound: func(ctx context.Context) (context.Context, context.CancelFunc) {
			return context.WithTimeout(ctx, 5*time.Second)
		}}
	stop := rep.start(ctx)
	t.Cleanup(func() { _ = pw.Close(); stop() })
	return rig
}

// writes returns the reports written so far: nothing else writes to the
// store after the instance, so each write of the report is one revision
// past the instance's.
func (rig *reportRig) writes() int64 {
	ctx := context.Background()
	kv, err := rig.st.Get(ctx, rig.key)
	if errors.Is(err, store.ErrNotFound) {
		return 0
	}
	if err != nil {
		rig.t.Fatal(err)
	}
	in, err := rig.st.Get(ctx, strings.TrimSuffix(rig.key, registry.ReportSuffix))
	if err != nil {
		rig.t.Fatal(err)
	}
	return kv.ModRevision - in.ModRevision
}

// waitEvent waits for an emitted event containing s.
func (rig *reportRig) waitEvent(s string) {
	rig.t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case e := <-rig.events:
			rig.seen = append(rig.seen, e)
			if strings.Contains(e, s) {
				return
			}
		case <-deadline:
			rig.t.Fatalf("no event with %q; got:\n%s", s, strings.Join(rig.seen, "\n"))
		}
	}
}

// TestTTLReportsCoalesce: lines that come faster than a quarter of the
// TTL are written as one report per quarter (the first at once, the last
// of each window at its end), and the end of standard input is said once,
// the registration kept.
func TestTTLReportsCoalesce(t *testing.T) {
	rig := newReportRig(t, 4*time.Second) // reports at least 1 s apart
	if _, err := io.WriteString(rig.lines, "ok\n"); err != nil {
		t.Fatal(err)
	}
	rig.waitEvent("report: reported: prod/batch/jobs/00000000000000e1 is fine")
	if n := rig.writes(); n != 1 {
		t.Fatalf("%d reports after the first line, want 1", n)
	}
	for i := range 1000 {
		if _, err := fmt.Fprintf(rig.lines, "ok %d\n", i); err != nil {
			t.Fatal(err)
		}
	}
	if err := rig.lines.Close(); err != nil {
		t.Fatal(err)
	}
	// What it says is what the checker does (health.Runner: one TTL, and
	// at most one read of the report later).
	rig.waitEvent("warning: warning: standard input ended: no more TTL reports; prod/batch/jobs/00000000000000e1 fails its check 4s after the last one (5s at most: the checker reads reports every 1s)")
	if n := rig.writes(); n != 2 {
		t.Fatalf("%d reports for 1,001 lines written within one window, want 2 (the first line, then the window's last)", n)
	}
	if _, err := rig.st.Get(context.Background(), strings.TrimSuffix(rig.key, registry.ReportSuffix)); err != nil {
		t.Fatalf("the instance after standard input ended: %v, want it registered still", err)
	}
}

// TestTTLReportsRefused: a TTL check's reports need a registry that takes
// them; other checks read no standard input.
func TestTTLReportsRefused(t *testing.T) {
	r := healthtest.NewRegistry(t)
	reg, err := r.Register(context.Background(), beacon.Instance{Namespace: "prod", Component: "api", Endpoint: "http",
		ID: "00000000000000e2", Address: "127.0.0.1:80", Check: &beacon.Check{Kind: beacon.CheckTCP}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := newTTLReports(nil, r, reg, strings.NewReader("ok\n"), nil, nil)
	if got != nil || err != nil {
		t.Fatalf("a tcp check: %v, %v; want no reports", got, err)
	}
	noReports := struct{ registry.Registry }{r} // hides Report
	ttl, err := r.Register(context.Background(), beacon.Instance{Namespace: "prod", Component: "api", Endpoint: "http",
		ID: "00000000000000e3", Address: "127.0.0.1:81", Check: &beacon.Check{Kind: beacon.CheckTTL, TTL: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	conn := &registryConn{}
	if _, err := newTTLReports(conn, noReports, ttl, strings.NewReader(""), nil, nil); err == nil ||
		!strings.Contains(err.Error(), "takes no TTL reports: declare grpc, http:/PATH or tcp") {
		t.Fatalf("a registry without reports: %v", err)
	}
}

// TestRegisterReportsTTL: beacon register --check ttl:DURATION reports
// for each line of its standard input; beacon serve's checker passes the
// instance while lines come, fails it when they stop for the TTL, passes
// it again when they resume; the end of standard input is said, and the
// instance stays registered (failing). The check declares no timing but
// its TTL: it fails one TTL after the last report, not after the default
// interval times the default fall (30 s).
func TestRegisterReportsTTL(t *testing.T) {
	dir := t.TempDir()
	client := freeURL(t)
	srv := startBeacon(t, dir, nil, withFreePorts(t, []string{"serve", "--data-dir", t.TempDir(), "--listen-client-urls", client}, nil)...)
	srv.waitLine(t, "beacon serve is ready", 60*time.Second)
	w := startBeacon(t, dir, nil, "watch", "prod", "--endpoints", client)
	w.waitLine(t, "synced", 30*time.Second)

	pr, pw := io.Pipe()
	defer pw.Close()
	reg := startBeaconIn(t, dir, nil, pr, "register", "prod/batch/jobs", "--addr", "127.0.0.1:7000", "--id", "00000000000000e4",
		"--check", "ttl:1s", "--endpoints", client)
	reg.waitLine(t, "registered prod/batch/jobs/00000000000000e4", 30*time.Second)
	reg.waitLine(t, "reading TTL reports from standard input", 10*time.Second)

	feed := newFeeder(pw, 200*time.Millisecond)
	w.waitLine(t, "00000000000000e4 127.0.0.1:7000 serving health=passing", 30*time.Second)
	feed.stop()
	w.waitLine(t, "00000000000000e4 127.0.0.1:7000 serving health=failing", 30*time.Second)
	feed = newFeeder(pw, 200*time.Millisecond)
	w.waitLine(t, "00000000000000e4 127.0.0.1:7000 serving health=passing", 30*time.Second)
	feed.stop()
	if err := pw.Close(); err != nil {
		t.Fatal(err)
	}
	reg.waitLine(t, "standard input ended: no more TTL reports", 10*time.Second)
	w.waitLine(t, "00000000000000e4 127.0.0.1:7000 serving health=failing", 30*time.Second)

	ls := startBeacon(t, dir, nil, "ls", "prod", "-o", "json", "--endpoints", client)
	if err := ls.wait(t, 30*time.Second); err != nil {
		t.Fatalf("ls: %v\n%s", err, ls.errOut())
	}
	var listed listJSON
	if err := json.Unmarshal([]byte(ls.out()), &listed); err != nil || len(listed.Instances) != 1 || listed.Instances[0].Health == nil ||
		listed.Instances[0].Health.Status != beacon.HealthFailing {
		t.Fatalf("ls after the reports ended (%v):\n%s", err, ls.out())
	}
	for _, b := range []*child{reg, w, srv} {
		if err := b.cmd.Process.Signal(syscall.SIGINT); err != nil {
			t.Fatal(err)
		}
		if err := b.wait(t, 30*time.Second); err != nil {
			t.Fatalf("%v after SIGINT: %v\n%s", b.cmd.Args, err, b.errOut())
		}
	}
}

// feeder writes a line to w at every tick until stopped: a service that
// keeps saying it is fine.
type feeder struct {
	quit chan struct{}
	wg   sync.WaitGroup
}

func newFeeder(w io.Writer, every time.Duration) *feeder {
	f := &feeder{quit: make(chan struct{})}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			if _, err := io.WriteString(w, "ok\n"); err != nil {
				return
			}
			select {
			case <-f.quit:
				return
			case <-tick.C:
			}
		}
	}()
	return f
}

func (f *feeder) stop() { close(f.quit); f.wg.Wait() }
