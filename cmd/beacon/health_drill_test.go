package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/testkit/machine"
	"github.com/beaconplane/beacon/internal/testkit/testpeer"
)

// healthTarget is a healthtarget process (internal/lab/healthtarget): a
// gRPC health and HTTP /healthz server whose health the test drives.
type healthTarget struct {
	cmd        *exec.Cmd
	in         io.WriteCloser
	lines      *bufio.Scanner
	grpc, http string
}

func startHealthTarget(t *testing.T) *healthTarget {
	t.Helper()
	bin := testpeer.GoBuild(t, "github.com/beaconplane/beacon/internal/lab/healthtarget")
	return runHealthTarget(t, testpeer.Command(bin))
}

// runHealthTarget starts cmd, a healthtarget, and reads its addresses.
func runHealthTarget(t *testing.T, cmd *exec.Cmd) *healthTarget {
	t.Helper()
	h := &healthTarget{cmd: cmd}
	in, out := testpeer.StartPiped(t, h.cmd)
	h.in, h.lines = in, bufio.NewScanner(out)
	t.Cleanup(func() {
		_ = h.cmd.Process.Signal(syscall.SIGCONT) // a stopped process cannot read its stdin closing
		_ = h.in.Close()
		_ = h.cmd.Wait()
	})
	for _, f := range []struct {
		prefix string
		to     *string
	}{{"grpc ", &h.grpc}, {"http ", &h.http}} {
		if !h.lines.Scan() || !strings.HasPrefix(h.lines.Text(), f.prefix) {
			t.Fatalf("healthtarget printed %q, want %q ADDR", h.lines.Text(), f.prefix)
		}
		*f.to = strings.TrimPrefix(h.lines.Text(), f.prefix)
	}
	return h
}

// do runs one command and waits for its acknowledgement.
func (h *healthTarget) do(t *testing.T, cmd string) {
	t.Helper()
	if _, err := fmt.Fprintln(h.in, cmd); err != nil {
		t.Fatal(err)
	}
	if !h.lines.Scan() || h.lines.Text() != "ok "+cmd {
		t.Fatalf("healthtarget answered %q to %q", h.lines.Text(), cmd)
	}
}

// TestHealthDrills: a worker whose serving stops while its lease lives —
// its registrant is another process (beacon register), so the lease is
// kept all along — leaves routing and comes back, for each way a server
// stops serving: NOT_SERVING (gRPC) and 503 (HTTP), a hung handler (the
// gRPC Watch stream stays open and silent; HTTP never answers), and the
// server process stopped (SIGSTOP). A server flapping at 1 Hz changes the
// verdict less often than it changes its status (rise and fall damp it).
// The checker is beacon serve's; the verdicts are read with beacon watch.
// How fast each transition comes is measured by `beacon bench health`,
// not here.
func TestHealthDrills(t *testing.T) {
	machine.Exclusive(t)
	dir := t.TempDir()
	client := freeURL(t)
	srv := startBeacon(t, dir, nil, withFreePorts(t, []string{"serve", "--data-dir", t.TempDir(), "--listen-client-urls", client}, nil)...)
	srv.waitLine(t, "beacon serve is ready", 60*time.Second)
	target := startHealthTarget(t)

	// Two more instances per service that keep passing (a TCP check on a
	// listener of this test), so that one failing instance is a third of
	// its service, below the panic threshold: it leaves routing.
	up := listenAndClose(t)
	const gid, hid = "00000000000000e1", "00000000000000e2"
	timing := []string{"--check-interval", "500ms", "--check-timeout", "200ms", "--check-rise", "2", "--check-fall", "3", "--endpoints", client}
	watch := map[string]*child{}
	for _, r := range []struct{ ep, id, addr, check string }{{"grpc", gid, target.grpc, "grpc"}, {"http", hid, target.http, "http:/healthz"}} {
		w := startBeacon(t, dir, nil, "watch", "drill/api/"+r.ep, "--endpoints", client)
		w.waitLine(t, "synced", 30*time.Second)
		watch[r.id] = w
		for i, id := range []string{r.id, r.id[:15] + "a", r.id[:15] + "b"} {
			addr, check := r.addr, r.check
			if i > 0 {
				addr, check = up, "tcp"
			}
			reg := startBeacon(t, dir, nil, append([]string{"register", "drill/api/" + r.ep, "--addr", addr, "--id", id, "--check", check}, timing...)...)
			reg.waitLine(t, "registered drill/api/"+r.ep+"/"+id, 30*time.Second)
		}
		waitHealth(t, w, r.id, "passing")
	}
	both := func(health string) {
		t.Helper()
		for _, id := range []string{gid, hid} {
			waitHealth(t, watch[id], id, health)
		}
	}
	for _, fault := range []struct {
		name       string
		stop, back func()
	}{
		{"not serving", func() { target.do(t, "not-serving") }, func() { target.do(t, "serving") }},
		{"hung handler", func() { target.do(t, "hang") }, func() { target.do(t, "serving") }},
		{"process stopped (SIGSTOP)", func() { sendSignal(t, target.cmd, syscall.SIGSTOP) }, func() { sendSignal(t, target.cmd, syscall.SIGCONT) }},
	} {
		t.Logf("%s: out of routing, the lease kept", fault.name)
		fault.stop()
		both("failing")
		fault.back()
		both("passing")
	}

	// Flapping: 20 status changes, one every 500 ms (1 Hz), then serving.
	const flips = 20
	before := len(watch[gid].out())
	target.do(t, fmt.Sprintf("flap 500ms %d", flips))
	waitHealth(t, watch[gid], gid, "passing") // settled (or it never left)
	changes := strings.Count(watch[gid].out()[before:], gid+" ")
	t.Logf("flapping at 1 Hz: %d status changes, %d verdict changes", flips, changes)
	if changes >= flips {
		t.Errorf("%d verdict changes for %d status changes: rise and fall did not damp the flapping", changes, flips)
	}
}

// waitHealth waits until the last change w printed for instance id says
// health (passing, or failing and out of routing: not in panic).
func waitHealth(t *testing.T, w *child, id, health string) {
	t.Helper()
	for {
		lines := strings.Split(w.out(), "\n")
		for i := len(lines) - 1; i >= 0; i-- {
			if strings.Contains(lines[i], id+" ") {
				if strings.Contains(lines[i], "health="+health+" ") {
					return
				}
				break
			}
		}
		w.waitLine(t, id+" ", 30*time.Second)
	}
}

// listenAndClose listens on a loopback port, accepting and closing every
// connection until the test ends, and returns its address.
func listenAndClose(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	return l.Addr().String()
}

func sendSignal(t *testing.T, cmd *exec.Cmd, sig syscall.Signal) {
	t.Helper()
	if err := cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
}
