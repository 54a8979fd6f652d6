package greeter_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/examples/greeter"
	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"github.com/beaconplane/beacon/store/etcd"
	"go.uber.org/goleak"
)

var server *etcdtest.Server

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	var err error
	server, err = etcdtest.New(etcdtest.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "start etcd:", err)
		return 1
	}
	code := m.Run()
	server.Close()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak: goroutines left after the tests:", err)
			return 1
		}
	}
	return code
}

// replies records what the client observed.
type replies struct {
	mu       sync.Mutex
	byServer map[string]int
	errs     []error
	wake     chan struct{}
}

func (r *replies) observe(server string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.errs = append(r.errs, err)
	} else {
		r.byServer[server]++
	}
	close(r.wake)
	r.wake = make(chan struct{})
}

// wait waits until ok holds for the counts by server.
func (r *replies) wait(t *testing.T, what string, ok func(map[string]int) bool) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		r.mu.Lock()
		done, wake := ok(r.byServer), r.wake
		r.mu.Unlock()
		if done {
			return
		}
		select {
		case <-wake:
		case <-deadline:
			t.Fatalf("client never saw %s: %v", what, r.byServer)
		}
	}
}

// The example end to end against a real etcd: two servers register, the
// client reaches both; one server shuts down (drain, deregister, stop) and
// the client moves to the other without a failed call.
func TestServersAndClient(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg := etcd.Config{Endpoints: server.Endpoints()}

	type running struct {
		cancel context.CancelFunc
		done   chan error
	}
	start := func(name string) running {
		sctx, scancel := context.WithCancel(ctx)
		ready := make(chan beacon.Instance, 1)
		done := make(chan error, 1)
		go func() {
			done <- greeter.RunServer(sctx, greeter.ServerConfig{
				// The client drops a draining server within milliseconds;
				// a second of grace keeps "no failed call" true on a slow,
				// loaded machine.
				Name: name, Etcd: cfg, DrainGrace: time.Second,
				Ready: func(in beacon.Instance) { ready <- in },
			})
		}()
		select {
		case in := <-ready:
			if in.Metadata["server"] != name || in.Transport != "grpc" {
				t.Errorf("registered %+v", in)
			}
		case err := <-done:
			t.Fatalf("server %s: %v", name, err)
		}
		return running{scancel, done}
	}
	one, two := start("one"), start("two")

	rec := &replies{byServer: map[string]int{}, wake: make(chan struct{})}
	var out strings.Builder
	cctx, ccancel := context.WithCancel(ctx)
	clientDone := make(chan greeter.ClientStats, 1)
	go func() {
		stats, err := greeter.RunClient(cctx, greeter.ClientConfig{
			Etcd: cfg, Interval: 10 * time.Millisecond, Name: "test", Observe: rec.observe, Out: &out,
		})
		if err != nil {
			t.Error(err)
		}
		clientDone <- stats
	}()
	rec.wait(t, "both servers", func(m map[string]int) bool { return m["one"] > 0 && m["two"] > 0 })

	one.cancel() // graceful: drain, deregister, stop
	if err := <-one.done; err != nil {
		t.Fatalf("server one: %v", err)
	}
	rec.mu.Lock()
	afterOne := rec.byServer["two"]
	rec.mu.Unlock()
	rec.wait(t, "20 more replies from two", func(m map[string]int) bool { return m["two"] >= afterOne+20 })

	ccancel()
	stats := <-clientDone
	two.cancel()
	if err := <-two.done; err != nil {
		t.Fatalf("server two: %v", err)
	}
	if stats.Failures != 0 || len(rec.errs) != 0 {
		t.Errorf("%d calls failed while a server drained: %v", stats.Failures, rec.errs)
	}
	if !strings.Contains(out.String(), "Hello, test (from two at 127.0.0.1:") {
		t.Errorf("client output:\n%s", out.String())
	}
}

func TestClientRejectsBadTarget(t *testing.T) {
	_, err := greeter.RunClient(context.Background(), greeter.ClientConfig{Target: "beacon://demo/greeter/grpc"})
	if err == nil || !strings.Contains(err.Error(), "three slashes") {
		t.Errorf("bad target: %v", err)
	}
}
