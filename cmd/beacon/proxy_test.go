package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

func TestProxyCommandServesAndStops(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	addr := strings.TrimPrefix(freeURL(t), "http://")
	// host:port, without a scheme, as every other command takes it.
	b := startBeacon(t, t.TempDir(), nil, "proxy", "--mode", "readonly", "--endpoints", strings.TrimPrefix(srv.Endpoint(), "http://"), "--listen-addr", addr,
		"--proxy-refresh-interval", "500", "--log-level", "warn")
	b.waitLine(t, "serving on "+addr, 30*time.Second)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{addr}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.Get(ctx, "k"); err != nil {
		t.Fatalf("get through beacon proxy: %v", err)
	}
	if _, err := cli.Put(ctx, "k", "v"); err == nil || !strings.Contains(err.Error(), "readonly") {
		t.Fatalf("put through a readonly beacon proxy: %v", err)
	}
	if err := b.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := b.wait(t, 30*time.Second); err != nil {
		t.Fatalf("beacon proxy exited with %v after SIGTERM\nstderr:\n%s", err, b.errOut())
	}
	checkQuietLog(t, b.errOut())
}

func TestProxyCommandBadInput(t *testing.T) {
	checkBadInput(t, []badInput{
		{args: []string{"proxy", "--mode", "readmostly"}, want: "unknown mode"},
		{args: []string{"proxy", "--initial-cluster", "a=http://127.0.0.1:2380", "--discovery-srv", "example.com"}, want: "conflicting discovery"},
		{args: []string{"proxy", "--discovery-token", "abc"}, want: "--discovery-endpoints"},
		{args: []string{"proxy", "--discovery-user", "u", "--discovery-password", "p", "--initial-cluster", "a=http://127.0.0.1:2380"}, want: "token"},
		{args: []string{"proxy", "--endpoints", "ftp://10.0.0.1:2379"}, want: "http or https"},
		{args: []string{"proxy", "--cacert", "/no/such/ca.pem", "--endpoints", "10.0.0.1:2379"}, want: "--cacert \"/no/such/ca.pem\""},
		{args: []string{"proxy", "--proxy-failure-wait", "soon"}, want: "milliseconds"},
	})
}

func TestMsDuration(t *testing.T) {
	var d time.Duration
	v := msDuration{&d}
	for in, want := range map[string]time.Duration{"5000": 5 * time.Second, "1s": time.Second, "250ms": 250 * time.Millisecond, "0": 0} {
		if err := v.Set(in); err != nil || d != want {
			t.Errorf("Set(%q) = %v, %v; want %v", in, d, err, want)
		}
	}
	if err := v.Set("soon"); err == nil {
		t.Error("Set(soon) succeeded")
	}
}

// TestProxyStartTimeoutZero: --start-timeout 0 looks for the cluster until
// interrupted (it silently meant the default 30 s): the answers meanwhile
// say there is no bound, and the proxy serves once the cluster comes up.
func TestProxyStartTimeoutZero(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	srv.Stop()
	addr := strings.TrimPrefix(freeURL(t), "http://")
	b := startBeacon(t, t.TempDir(), nil, "proxy", "--endpoints", srv.Endpoint(), "--listen-addr", addr, "--start-timeout", "0")
	b.waitLine(t, "beacon proxy listening on "+addr, 30*time.Second)
	resp, err := http.Get("http://" + addr + "/health")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "with no bound") {
		t.Fatalf("/health while finding the cluster: %d %s", resp.StatusCode, body)
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	b.waitLine(t, "serving on "+addr, 60*time.Second)
	if err := b.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := b.wait(t, 30*time.Second); err != nil {
		t.Fatalf("beacon proxy: %v\n%s", err, b.errOut())
	}
}

// TestProxyCommandAnswersWhileFindingTheCluster: `beacon proxy` pointed at
// a cluster that is not there answers on its port at once — /health 503
// saying why — logs its retries at a bounded rate (one WARN, not one per
// retry), and exits after --start-timeout saying what it tried.
func TestProxyCommandAnswersWhileFindingTheCluster(t *testing.T) {
	dead := freeURL(t) // nothing listens there
	addr := strings.TrimPrefix(freeURL(t), "http://")
	b := startBeacon(t, t.TempDir(), nil, "proxy", "--endpoints", dead, "--listen-addr", addr, "--start-timeout", "4s")
	b.waitLine(t, "beacon proxy listening on "+addr, 3*time.Second) // bound: it answers from now on
	resp, err := http.Get("http://" + addr + "/health")
	if err != nil {
		t.Fatalf("/health while finding the cluster: %v\nstderr:\n%s", err, b.errOut())
	}
	code := resp.StatusCode
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if code != http.StatusServiceUnavailable || !strings.Contains(string(body), "not ready: no reachable etcd member found yet") || !strings.Contains(string(body), dead) {
		t.Fatalf("/health while finding the cluster: %d %s", code, body)
	}
	if err := b.wait(t, 30*time.Second); err == nil {
		t.Fatal("beacon proxy exited 0 without a cluster")
	}
	stderr := b.errOut()
	if !strings.Contains(stderr, "no usable etcd cluster found within 4s") || !strings.Contains(stderr, dead) {
		t.Fatalf("stderr does not say what was tried:\n%s", stderr)
	}
	if n := strings.Count(stderr, `level=WARN msg="cluster not reachable yet`); n != 1 {
		t.Fatalf("%d WARN lines for the retries of 4 s, want 1:\n%s", n, stderr)
	}
}

// TestProxyOutOfFileDescriptorsRecovers: a proxy that runs out of file
// descriptors (a flood of connections with its connection bound off, the
// open-file limit low) logs why it cannot accept, and serves again once
// the flood ends. Before, the first failed accept closed its listener for
// good while the process lived on, silent.
func TestProxyOutOfFileDescriptorsRecovers(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	addr := strings.TrimPrefix(freeURL(t), "http://")
	cmd := beaconCmd(t, t.TempDir(), nil, "proxy", "--endpoints", strings.TrimPrefix(srv.Endpoint(), "http://"), "--listen-addr", addr,
		"--max-connections", "-1", "--log-level", "warn")
	prlimit, err := exec.LookPath("prlimit") // util-linux, on every Debian
	if err != nil {
		t.Fatal(err)
	}
	cmd.Args = append([]string{prlimit, "--nofile=128:128", "--", cmd.Path}, cmd.Args[1:]...)
	cmd.Path = prlimit
	b := runChild(t, cmd)
	b.waitLine(t, "serving on "+addr, 30*time.Second)

	var flood []net.Conn
	for range 400 {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			break // the accept queue is full
		}
		flood = append(flood, c)
	}
	waitStderr(t, b, "accepting a client connection failed; trying again", 30*time.Second)
	for _, c := range flood {
		_ = c.Close()
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{addr}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "after-the-flood", "v"); err != nil {
		t.Fatalf("a put once the flood ended: %v\nstderr:\n%s", err, b.errOut())
	}
}
