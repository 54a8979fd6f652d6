package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"github.com/miekg/dns"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/etcdtest"
)

// The tests run the beacon command itself in a child process: the test
// binary re-executes itself with beaconMainEnv set, and TestMain then runs
// main() instead of the tests.
const beaconMainEnv = "BEACON_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(beaconMainEnv) != "" {
		os.Args = append([]string{"beacon"}, strings.Fields(os.Getenv(beaconMainEnv))...)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// child is a running child `beacon` process.
type child struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	stdout bytes.Buffer
	lines  chan string
	stderr bytes.Buffer
	done   chan struct{}
	err    error
}

// startBeacon starts `beacon args...` in dir with extra environment.
func startBeacon(t *testing.T, dir string, env []string, args ...string) *child {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(), beaconMainEnv+"="+strings.Join(args, " ")), env...)
	b := &child{cmd: cmd, lines: make(chan string, 100), done: make(chan struct{})}
	cmd.Stderr = &lockedWriter{mu: &b.mu, w: &b.stderr}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			b.mu.Lock()
			b.stdout.WriteString(sc.Text() + "\n")
			b.mu.Unlock()
			select {
			case b.lines <- sc.Text():
			default:
			}
		}
		b.err = cmd.Wait()
		close(b.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-b.done
	})
	return b
}

// waitLine waits for a stdout line containing s.
func (b *child) waitLine(t *testing.T, s string, timeout time.Duration) string {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case l := <-b.lines:
			if strings.Contains(l, s) {
				return l
			}
		case <-b.done:
			t.Fatalf("beacon exited (%v) before printing %q\nstdout:\n%s\nstderr:\n%s", b.err, s, b.out(), b.errOut())
		case <-deadline:
			t.Fatalf("beacon did not print %q within %v\nstdout:\n%s\nstderr:\n%s", s, timeout, b.out(), b.errOut())
		}
	}
}

// wait waits for the process to exit.
func (b *child) wait(t *testing.T, timeout time.Duration) error {
	t.Helper()
	select {
	case <-b.done:
		return b.err
	case <-time.After(timeout):
		t.Fatalf("beacon did not exit within %v\nstderr:\n%s", timeout, b.errOut())
		return nil
	}
}

func (b *child) out() string    { b.mu.Lock(); defer b.mu.Unlock(); return b.stdout.String() }
func (b *child) errOut() string { b.mu.Lock(); defer b.mu.Unlock(); return b.stderr.String() }

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func freeURL(t *testing.T) string {
	t.Helper()
	p, err := etcdtest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("http://127.0.0.1:%d", p)
}

func TestServeStartsAndStopsOnSIGTERM(t *testing.T) {
	client, peer, httpURL := freeURL(t), freeURL(t), freeURL(t)
	b := startBeacon(t, t.TempDir(), nil, "serve", "--listen-client-urls", client, "--listen-peer-urls", peer,
		"--http-addr", strings.TrimPrefix(httpURL, "http://"), "--data-dir", "data", "--dns-addr", "127.0.0.1:0")
	b.waitLine(t, "beacon serve is ready", 60*time.Second)
	b.waitLine(t, "DNS", 5*time.Second)
	if !strings.Contains(b.out(), client) {
		t.Fatalf("banner lacks the client URL %s:\n%s", client, b.out())
	}
	resp, err := http.Get(httpURL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("/readyz = %d", resp.StatusCode)
	}
	if err := b.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := b.wait(t, 30*time.Second); err != nil {
		t.Fatalf("beacon serve exited with %v after SIGTERM\nstderr:\n%s", err, b.errOut())
	}
	if !strings.Contains(b.out(), "beacon serve stopped") {
		t.Fatalf("no shutdown message:\n%s", b.out())
	}
}

func TestServeBadInputFailsWithOneLine(t *testing.T) {
	checkBadInput(t, []badInput{
		{[]string{"serve", "--listen-client-urls", "tcp://x:1"}, "scheme must be http or https"},
		{[]string{"serve", "--http-addr", "nope"}, "--http-addr"},
		{[]string{"serve", "--initial-cluster-state", "maybe"}, "must be new or existing"},
		{[]string{"serve", "--backend", "zookeeper"}, "unknown"},
		{[]string{"serve", "--log-level", "loud"}, "--log-level"},
		{[]string{"serve", "--no-such-flag"}, "unknown flag"},
		{[]string{"serve", "--shutdown-timeout", "soon"}, "invalid argument"},
		{[]string{"serve", "--dns-addr", "nope"}, "--dns-addr"},
		{[]string{"serve", "--dns-domain", "."}, "--dns-domain"},
		{[]string{"serve", "--dns-ttl", "100ms"}, "--dns-ttl"},
	})
}

func TestServePortInUse(t *testing.T) {
	// A second server on the same ports must fail with a clear line.
	client, peer, httpURL := freeURL(t), freeURL(t), freeURL(t)
	args := []string{"serve", "--listen-client-urls", client, "--listen-peer-urls", peer,
		"--http-addr", strings.TrimPrefix(httpURL, "http://"), "--dns-addr="}
	first := startBeacon(t, t.TempDir(), nil, args...)
	first.waitLine(t, "beacon serve is ready", 60*time.Second)
	second := startBeacon(t, t.TempDir(), nil, args...)
	if err := second.wait(t, 30*time.Second); err == nil {
		t.Fatal("second server exited 0")
	}
	if !strings.Contains(second.errOut(), "address already in use") {
		t.Fatalf("stderr: %s", second.errOut())
	}
}

func TestVersionAndHelp(t *testing.T) {
	b := startBeacon(t, t.TempDir(), nil, "version")
	if err := b.wait(t, 30*time.Second); err != nil || !strings.HasPrefix(b.out(), "beacon ") {
		t.Fatalf("version: %v %q", err, b.out())
	}
	b = startBeacon(t, t.TempDir(), nil, "serve", "--help")
	if err := b.wait(t, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"--data-dir", "--etcd-endpoints", "BEACON_DISCOVERY_BACKEND", "ETCD_AUTH_USERNAME"} {
		if !strings.Contains(b.out(), want) {
			t.Errorf("serve --help lacks %s", want)
		}
	}
}

// TestReadmeServeCommand runs the README's first set-up command as written
// (`go run ./cmd/beacon serve`, i.e. `beacon serve` with every default) and
// checks that an etcd client and the HTTP API answer on the documented ports.
func TestReadmeServeCommand(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, cmd := range []string{"go run ./cmd/beacon serve", "go test ./..."} {
		if !bytes.Contains(readme, []byte(cmd)) {
			t.Fatalf("README.md no longer gives %q", cmd)
		}
	}
	b := startBeacon(t, t.TempDir(), nil, "serve")
	b.waitLine(t, "beacon serve is ready", 60*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, url := range []string{"http://127.0.0.1:2379/health", "http://127.0.0.1:9379/readyz"} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("%s = %d", url, resp.StatusCode)
		}
	}
	soa := new(dns.Msg)
	soa.SetQuestion("beacon.", dns.TypeSOA)
	if r, _, err := (&dns.Client{Net: "tcp", Timeout: 10 * time.Second}).ExchangeContext(ctx, soa, "127.0.0.1:9353"); err != nil || r.Rcode != dns.RcodeSuccess {
		t.Errorf("DNS on 127.0.0.1:9353: %v %v", r, err)
	}
	_ = b.cmd.Process.Signal(syscall.SIGINT)
	if err := b.wait(t, 30*time.Second); err != nil {
		t.Fatalf("exit after SIGINT: %v\n%s", err, b.errOut())
	}
}

// badInput is a command line that must fail.
type badInput struct {
	args []string
	want string // in the error; "" for any
}

// checkBadInput runs each command line in its own child process and checks
// that it exits non-zero with exactly one line of error, "beacon: ...",
// containing want.
func checkBadInput(t *testing.T, tests []badInput) {
	t.Helper()
	for _, tt := range tests {
		b := startBeacon(t, t.TempDir(), nil, tt.args...)
		if err := b.wait(t, 30*time.Second); err == nil {
			t.Errorf("%v: exit status 0", tt.args)
			continue
		}
		stderr := strings.TrimSpace(b.errOut())
		if !strings.Contains(stderr, tt.want) || !strings.HasPrefix(stderr, "beacon: ") || strings.Contains(stderr, "\n") {
			t.Errorf("%v: stderr %q, want one 'beacon: ' line containing %q", tt.args, stderr, tt.want)
		}
	}
}
