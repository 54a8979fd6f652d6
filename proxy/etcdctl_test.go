package proxy

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"github.com/beaconplane/beacon/internal/testkit/testpeer"
)

// buildEtcdctl builds the real etcdctl 3.7.3 (internal/etcdctl).
func buildEtcdctl(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "etcdctl")
	out, err := testpeer.Command("go", "build", "-o", bin, "github.com/beaconplane/beacon/internal/etcdctl").CombinedOutput()
	if err != nil {
		t.Fatalf("build etcdctl: %v\n%s", err, out)
	}
	return bin
}

type ctl struct {
	t        *testing.T
	bin, ep  string
	extraEnv []string
}

func (c ctl) run(args ...string) (string, error) { return c.runIn("", args...) }

func (c ctl) runIn(stdin string, args ...string) (string, error) {
	c.t.Helper()
	cmd := testpeer.CommandContext(ctxT(c.t), c.bin, append([]string{"--endpoints", c.ep, "--dial-timeout", "5s"}, args...)...)
	cmd.Env = append(os.Environ(), c.extraEnv...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (c ctl) must(args ...string) string {
	c.t.Helper()
	out, err := c.run(args...)
	if err != nil {
		c.t.Fatalf("etcdctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// TestEtcdctlThroughProxy drives the real etcdctl 3.7.3 through the proxy:
// KV, transactions, leases, watch, member list and endpoint status; and a
// readonly proxy refusing its writes.
func TestEtcdctlThroughProxy(t *testing.T) {
	t.Parallel()
	c := etcdtest.StartCluster(t, 3)
	p := startProxy(t, Config{PeerURLs: c.PeerURLs()})
	e := ctl{t: t, bin: buildEtcdctl(t), ep: p.Addr().String()}

	if out := e.must("put", "foo", "bar"); strings.TrimSpace(out) != "OK" {
		t.Fatalf("put: %q", out)
	}
	if out := e.must("get", "foo"); out != "foo\nbar\n" {
		t.Fatalf("get: %q", out)
	}
	txn := "value(\"foo\") = \"bar\"\n\nput foo baz\n\nput foo qux\n\n"
	if out, err := e.runIn(txn, "txn"); err != nil || !strings.HasPrefix(out, "SUCCESS") {
		t.Fatalf("txn: %v %q", err, out)
	}
	out := e.must("lease", "grant", "30")
	m := regexp.MustCompile(`lease ([0-9a-f]+) granted`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("lease grant: %q", out)
	}
	e.must("put", "--lease="+m[1], "leased", "x")
	if out := e.must("lease", "keep-alive", "--once", m[1]); !strings.Contains(out, "keepalived with TTL") {
		t.Fatalf("keep-alive: %q", out)
	}
	if out := e.must("lease", "timetolive", "--keys", m[1]); !strings.Contains(out, "leased") {
		t.Fatalf("timetolive: %q", out)
	}
	e.must("lease", "revoke", m[1])
	if out := e.must("member", "list"); strings.Count(out, "started") != 3 {
		t.Fatalf("member list: %q", out)
	}
	if out := e.must("endpoint", "status"); !strings.Contains(out, p.Addr().String()) {
		t.Fatalf("endpoint status: %q", out)
	}
	if out := e.must("endpoint", "health"); !strings.Contains(out, "is healthy") {
		t.Fatalf("endpoint health: %q", out)
	}
	// lock uses a session (lease + keep-alive) and etcd's Lock service.
	if out := e.must("lock", "mylock", "echo", "locked"); !strings.Contains(out, "locked") {
		t.Fatalf("lock: %q", out)
	}
	if out := e.must("del", "foo"); strings.TrimSpace(out) != "1" {
		t.Fatalf("del: %q", out)
	}

	// watch prints events as they come.
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	cmd := testpeer.CommandContext(ctx, e.bin, "--endpoints", e.ep, "watch", "w")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); _ = cmd.Wait() }()
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	eventually(t, "etcdctl's watch registered", func() bool { return value(t, p.m.clientWatchers) >= 1 })
	e.must("put", "w", "x")
	var got []string
	for len(got) < 3 {
		l, ok := <-lines
		if !ok {
			t.Fatalf("watch output ended: %v", got)
		}
		got = append(got, l)
	}
	if strings.Join(got, " ") != "PUT w x" {
		t.Fatalf("watch printed %v", got)
	}

	// A readonly proxy refuses etcdctl's writes with a clear message.
	ro := startProxy(t, Config{Mode: ReadOnly, PeerURLs: c.PeerURLs()})
	r := ctl{t: t, bin: e.bin, ep: ro.Addr().String()}
	if out, err := r.run("put", "foo", "bar"); err == nil || !strings.Contains(out, "readonly") {
		t.Fatalf("put through a readonly proxy: %v %q", err, out)
	}
	if out := r.must("get", "w"); out != "w\nx\n" {
		t.Fatalf("get through a readonly proxy: %q", out)
	}
}

// TestDebianEtcdctl34ThroughProxy: the etcd 3.4 etcdctl from Debian
// (etcd-client) works through the proxy too.
func TestDebianEtcdctl34ThroughProxy(t *testing.T) {
	t.Parallel()
	bin := testpeer.Binary(t, "apt-get install -y etcd-client", "/usr/bin/etcdctl")
	c := etcdtest.StartCluster(t, 3)
	p := startProxy(t, Config{Endpoints: c.Endpoints()})
	e := ctl{t: t, bin: bin, ep: p.Addr().String(), extraEnv: []string{"ETCDCTL_API=3"}}
	if out := e.must("put", "k34", "v"); strings.TrimSpace(out) != "OK" {
		t.Fatalf("put: %q", out)
	}
	if out := e.must("get", "k34"); out != "k34\nv\n" {
		t.Fatalf("get: %q", out)
	}
	if out := e.must("member", "list"); strings.Count(out, "started") != 3 {
		t.Fatalf("member list: %q", out)
	}
}
