package main

import (
	"bufio"
	"context"
	"errors"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"github.com/beaconplane/beacon/internal/testkit/testpeer"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sys/unix"
)

// runUntilInterrupted runs the beacon binary with args, waits for a log
// line containing ready, sends SIGINT to its process group (Ctrl-C), and
// returns its stderr once it has exited.
func runUntilInterrupted(t *testing.T, ready string, args ...string) string {
	t.Helper()
	bin := testpeer.GoBuild(t, "github.com/beaconplane/beacon/cmd/beacon")
	cmd := testpeer.Command(bin, args...)
	// Its own process group, signalled whole, as a terminal's Ctrl-C
	// signals the foreground group: the benchmark's children get it too
	// unless they are in groups of their own.
	cmd.SysProcAttr.Setpgid = true
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var log strings.Builder
	seen := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(stderr)
		once := sync.Once{}
		for sc.Scan() {
			mu.Lock()
			log.WriteString(sc.Text() + "\n")
			mu.Unlock()
			if strings.Contains(sc.Text(), ready) {
				once.Do(func() { close(seen) })
			}
		}
	}()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	select {
	case <-seen:
	case <-done:
		t.Fatalf("beacon %v exited before %q:\n%s", args, ready, log.String())
	case <-time.After(3 * time.Minute):
		t.Fatalf("beacon %v: no %q within 3 minutes", args, ready)
	}
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { <-done; exited <- cmd.Wait() }()
	select {
	case <-exited:
	case <-time.After(time.Minute):
		t.Fatalf("beacon %v did not exit within a minute of SIGINT", args)
	}
	mu.Lock()
	defer mu.Unlock()
	return log.String()
}

var pidRE = regexp.MustCompile(`msg=started process=(\S+|"[^"]+") pid=(\d+)`)

// checkChildrenGone checks that every child process the benchmark logged
// as started has ended.
func checkChildrenGone(t *testing.T, log string, want int) {
	t.Helper()
	ms := pidRE.FindAllStringSubmatch(log, -1)
	if len(ms) != want {
		t.Fatalf("%d child processes logged, want %d:\n%s", len(ms), want, log)
	}
	for _, m := range ms {
		pid, _ := strconv.Atoi(m[2])
		if !exitsWithin(t, pid, 10*time.Second) {
			t.Fatalf("child %s (pid %d) still running after the benchmark was interrupted", m[1], pid)
		}
	}
}

// exitsWithin waits for the exit of pid, a process that is not this one's
// child, through a pidfd (readable once the process has exited).
func exitsWithin(t *testing.T, pid int, d time.Duration) bool {
	t.Helper()
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return true // gone, and reaped
	}
	if err != nil {
		t.Fatalf("pidfd_open %d: %v", pid, err)
	}
	defer unix.Close(fd)
	deadline := time.Now().Add(d)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return false
		}
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, int(left.Milliseconds())+1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			t.Fatalf("poll pidfd of %d: %v", pid, err)
		}
		if n > 0 {
			return true
		}
	}
}

// TestBenchProxyInterrupted: Ctrl-C in the middle of `beacon bench proxy`
// stops both proxy processes and removes every key the benchmark wrote.
func TestBenchProxyInterrupted(t *testing.T) {
	if testing.Short() {
		t.Skip("builds beacon and etcd")
	}
	srv := etcdtest.Start(t, etcdtest.Options{})
	etcdBin := testpeer.GoBuild(t, "github.com/beaconplane/beacon/internal/lab/etcd")
	log := runUntilInterrupted(t, "op=range-s", "bench", "proxy", "--endpoints", srv.Endpoint(), "--etcd-bin", etcdBin,
		"--rounds", "50", "--duration", "300ms", "--watches", "20", "--streams", "2")
	checkChildrenGone(t, log, 2)
	checkNoBenchKeys(t, srv)
}

// TestBenchRegisterInterrupted: Ctrl-C in the middle of `beacon bench
// register` against an etcd leaves no lease and no key behind.
func TestBenchRegisterInterrupted(t *testing.T) {
	if testing.Short() {
		t.Skip("builds beacon")
	}
	srv := etcdtest.Start(t, etcdtest.Options{})
	runUntilInterrupted(t, `side="raw etcd"`, "bench", "register", "--endpoints", srv.Endpoint(),
		"--rounds", "50", "--instances", "3000", "--concurrency", "64")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cli := srv.Client(t)
	leases, err := cli.Leases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(leases.Leases) != 0 {
		t.Fatalf("%d leases left after the interrupt", len(leases.Leases))
	}
	for _, prefix := range []string{"/bench-raw/", "/bench-beacon/", "/bench-txn/"} {
		resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		if resp.Count != 0 {
			t.Fatalf("%d keys left under %s after the interrupt", resp.Count, prefix)
		}
	}
}

// TestBenchWatchInterrupted: Ctrl-C (SIGINT to the process group) in the
// middle of `beacon bench watch` with its own etcd, while it writes the
// samples: the benchmark undoes its run (revokes the samples' lease) and
// stops that etcd and both watcher processes; nothing is left running.
// (That the etcd is out of the terminal's group, so that it still answers
// the revoke: TestServerChildOwnGroup.)
func TestBenchWatchInterrupted(t *testing.T) {
	if testing.Short() {
		t.Skip("builds beacon")
	}
	log := runUntilInterrupted(t, "watch: writing samples", "bench", "watch", "--watchers", "10", "--samples", "20000")
	checkChildrenGone(t, log, 3) // etcd, Beacon's watchers, raw etcd's watchers
	if !strings.Contains(log, "beacon: bench interrupted: nothing measured; what the run made was removed") {
		t.Errorf("the interrupt is not said as such:\n%s", log)
	}
	if strings.Contains(log, "could not revoke") {
		t.Fatalf("the interrupted benchmark could not undo its run:\n%s", log)
	}
}

var namespacesRE = regexp.MustCompile(`msg="cluster: members started" namespaces=(\S*)`)

// TestBenchClusterInterrupted: Ctrl-C in the middle of `beacon bench
// cluster`, while instances are being registered: every member process has
// ended and every network namespace the run made is gone.
func TestBenchClusterInterrupted(t *testing.T) {
	if testing.Short() {
		t.Skip("builds beacon")
	}
	log := runUntilInterrupted(t, "cluster: registering", "bench", "cluster", "--instances", "200000", "--services", "20",
		"--watchers", "6", "--ceiling", "100", "--rounds", "20")
	checkChildrenGone(t, log, 3)
	m := namespacesRE.FindStringSubmatch(log)
	if m == nil {
		t.Fatalf("no namespaces logged:\n%s", log)
	}
	if m[1] == "" {
		return // on loopback: nothing more to remove
	}
	out, err := testpeer.Command("ip", "netns", "list").CombinedOutput()
	if err != nil {
		t.Fatalf("ip netns list: %v: %s", err, out)
	}
	for _, ns := range strings.Split(m[1], ",") {
		if regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(ns) + `\b`).Match(out) {
			t.Errorf("namespace %s left after the interrupt:\n%s", ns, out)
		}
	}
}
