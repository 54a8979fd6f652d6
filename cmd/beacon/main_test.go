package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"github.com/beaconplane/beacon/internal/testkit/testpeer"
)

// The tests run the beacon command itself in a child process: the test
// binary re-executes itself with beaconMainEnv set, and TestMain then runs
// main() instead of the tests.
const beaconMainEnv = "BEACON_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	selfCommand = testSelfCommand // bench drill's nodes and registrants
	if v := os.Getenv(beaconMainEnv); v != "" {
		var args []string
		if err := json.Unmarshal([]byte(v), &args); err != nil {
			args = strings.Fields(v)
		}
		os.Args = append([]string{"beacon"}, args...)
		// A beacon command that starts beacon again (os.Executable: bench
		// runs its etcd and proxies as children) starts this test binary
		// with its own arguments: it must run them, not these again.
		_ = os.Unsetenv(beaconMainEnv)
		_ = os.Setenv(beaconArgvEnv, "1")
		main()
		os.Exit(0)
	}
	if os.Getenv(beaconArgvEnv) != "" {
		os.Args[0] = "beacon"
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// beaconArgvEnv marks a process started by a beacon command run from the
// tests: the test binary then is beacon, with the arguments it was given.
const beaconArgvEnv = "BEACON_TEST_RUN_ARGV"

// child is a running child `beacon` process.
type child struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	stdout bytes.Buffer
	lines  chan string
	stderr bytes.Buffer
	wrote  chan struct{} // a token after each write to stderr
	done   chan struct{}
	err    error
}

// startBeacon starts `beacon args...` in dir with extra environment.
func startBeacon(t *testing.T, dir string, env []string, args ...string) *child {
	t.Helper()
	return startBeaconIn(t, dir, env, nil, args...)
}

// withXDSPort gives a `beacon serve` whose test chose its ports (it sets
// --http-addr) and not the xDS one a free xDS port: xDS is on by default,
// and no test may depend on its default port being free.
func withXDSPort(args []string) []string {
	if len(args) == 0 || args[0] != "serve" {
		return args
	}
	chose := false
	for _, a := range args {
		if a == "--xds-addr" || strings.HasPrefix(a, "--xds-addr=") {
			return args
		}
		chose = chose || a == "--http-addr" || strings.HasPrefix(a, "--http-addr=")
	}
	if !chose {
		return args
	}
	return append(append([]string(nil), args...), "--xds-addr", "127.0.0.1:0")
}

// startBeaconIn is startBeacon with standard input (nil: none).
func startBeaconIn(t *testing.T, dir string, env []string, stdin io.Reader, args ...string) *child {
	t.Helper()
	cmd := beaconCmd(t, dir, env, args...)
	cmd.Stdin = stdin
	return runChild(t, cmd)
}

// beaconCmd is the command that runs `beacon args...` in dir with extra
// environment.
func beaconCmd(t *testing.T, dir string, env []string, args ...string) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := testpeer.Command(exe)
	cmd.Dir = dir
	encoded, err := json.Marshal(withXDSPort(args)) // keeps empty and spaced arguments
	if err != nil {
		t.Fatal(err)
	}
	cmd.Env = append(append(os.Environ(), beaconMainEnv+"="+string(encoded)), env...)
	return cmd
}

// runChild starts cmd, a beacon command (beaconCmd's, possibly wrapped),
// collecting its output; the test's end kills it.
func runChild(t *testing.T, cmd *exec.Cmd) *child {
	t.Helper()
	b := &child{cmd: cmd, lines: make(chan string, 100), wrote: make(chan struct{}, 1), done: make(chan struct{})}
	cmd.Stderr = &lockedWriter{mu: &b.mu, w: &b.stderr, wrote: b.wrote}
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
			// The lines it printed before exiting may still be queued:
			// select picks either ready case.
			for len(b.lines) > 0 {
				if l := <-b.lines; strings.Contains(l, s) {
					return l
				}
			}
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

// exitCode is the exit status of a process that has exited.
func (b *child) exitCode() int {
	<-b.done
	if b.err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(b.err, &ee) {
		return ee.ExitCode()
	}
	return -1
}

func (b *child) out() string    { b.mu.Lock(); defer b.mu.Unlock(); return b.stdout.String() }
func (b *child) errOut() string { b.mu.Lock(); defer b.mu.Unlock(); return b.stderr.String() }

type lockedWriter struct {
	mu    *sync.Mutex
	w     io.Writer
	wrote chan struct{} // if not nil, gets a token after each write
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n, err := l.w.Write(p)
	if l.wrote != nil {
		select {
		case l.wrote <- struct{}{}:
		default:
		}
	}
	return n, err
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
	// What the server answers while it runs names the flag to change, as
	// its errors at start do (server.Config.SettingName).
	req, err := http.NewRequest(http.MethodGet, httpURL+"/readyz", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = "rebound.example"
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusMisdirectedRequest || !strings.Contains(string(body), "--host-whitelist") {
		t.Errorf("a foreign Host: %d %s, want 421 naming --host-whitelist", resp.StatusCode, body)
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
	checkQuietLog(t, b.errOut())
}

// TestServeSecondSignalCutsShutdownShort: the first SIGTERM starts a
// graceful shutdown that waits (here up to an hour) for a request in
// flight; a second signal ends it at once, and serve exits 0.
func TestServeSecondSignalCutsShutdownShort(t *testing.T) {
	client, peer, httpURL := freeURL(t), freeURL(t), freeURL(t)
	addr := strings.TrimPrefix(httpURL, "http://")
	b := startBeacon(t, t.TempDir(), nil, "serve", "--listen-client-urls", client, "--listen-peer-urls", peer,
		"--http-addr", addr, "--data-dir", "data", "--dns-addr=", "--shutdown-timeout", "1h", "--http-request-timeout", "1h")
	b.waitLine(t, "beacon serve is ready", 60*time.Second)
	// A request whose body never comes: in flight until it does.
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "POST /v1/tokens HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"); err != nil {
		t.Fatal(err)
	}
	// The server has it once a second request on another connection is
	// answered after it (requests are served concurrently).
	resp, err := http.Get(httpURL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if err := b.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitStderr(t, b, "a second SIGINT or SIGTERM cuts it short", 30*time.Second)
	if err := b.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if err := b.wait(t, 60*time.Second); err != nil {
		t.Fatalf("beacon serve exited with %v after a second signal\nstderr:\n%s", err, b.errOut())
	}
	if !strings.Contains(b.errOut(), "shutdown cut short") || !strings.Contains(b.out(), "beacon serve stopped") {
		t.Fatalf("stdout:\n%s\nstderr:\n%s", b.out(), b.errOut())
	}
}

// waitStderr waits for s on the child's standard error.
func waitStderr(t *testing.T, b *child, s string, timeout time.Duration) {
	t.Helper()
	deadline := time.After(timeout)
	for !strings.Contains(b.errOut(), s) {
		select {
		case <-b.done:
			if strings.Contains(b.errOut(), s) {
				return
			}
			t.Fatalf("beacon exited (%v) before logging %q\nstderr:\n%s", b.err, s, b.errOut())
		case <-deadline:
			t.Fatalf("beacon did not log %q within %v\nstderr:\n%s", s, timeout, b.errOut())
		case <-b.wrote:
		}
	}
}

func TestServeBadInputFailsWithOneLine(t *testing.T) {
	checkBadInput(t, []badInput{
		{args: []string{"serve", "--listen-client-urls", "tcp://x:1"}, want: "scheme must be http or https"},
		{args: []string{"serve", "--http-addr", "nope"}, want: "--http-addr"},
		{args: []string{"serve", "--initial-cluster-state", "maybe"}, want: "must be new or existing"},
		{args: []string{"serve", "--backend", "zookeeper"}, want: "unknown"},
		{args: []string{"serve", "--log-level", "loud"}, want: "--log-level"},
		{args: []string{"serve", "--no-such-flag"}, want: "unknown flag"},
		{args: []string{"serve", "--shutdown-timeout", "soon"}, want: "invalid argument"},
		{args: []string{"serve", "--dns-addr", "nope"}, want: "--dns-addr"},
		{args: []string{"serve", "--dns-domain", "."}, want: "--dns-domain"},
		{args: []string{"serve", "--dns-ttl", "100ms"}, want: "--dns-ttl"},
		{args: []string{"serve", "--dns-ttl", "0s"}, want: "--dns-ttl 0s"},
		{args: []string{"serve", "--dns-domain="}, want: `--dns-domain "": empty (an unset variable?): give a value, or leave it out for its default, beacon.`},
		// etcd would replace it by its default, with a warning at every start.
		{args: []string{"serve", "--bcrypt-cost", "99"}, want: "--bcrypt-cost 99: must be 4 to 31"},
		// A port out of range is bad usage, not a failure to listen (exit 1).
		{args: []string{"serve", "--http-addr", "127.0.0.1:99999"}, want: `--http-addr "127.0.0.1:99999": must be host:port: port "99999" is not a number from 0 to 65535`},
		// A Unix socket was "port is not a number" (proxy) or a bare
		// "must be host:port": say they are not supported.
		{args: []string{"serve", "--http-addr", "unix:///run/beacon.sock"}, want: `--http-addr "unix:///run/beacon.sock": is a Unix socket: Unix sockets are not supported here; give host:port`},
		{args: []string{"serve", "--dns-addr", "unix:///x"}, want: `--dns-addr "unix:///x": is a Unix socket`},
		{args: []string{"serve", "--listen-client-urls", "unix:///x"}, want: `is a Unix socket: Unix sockets are not supported`},
		{args: []string{"proxy", "--listen-addr", "unix:///x"}, want: `--listen-addr "unix:///x": is a Unix socket: Unix sockets are not supported here; give host:port, e.g. 127.0.0.1:23790`},
		{args: []string{"proxy", "--listen-addr", "23790"}, want: `--listen-addr "23790": is a bare port: give host:port (:23790 for every interface`},
		{args: []string{"serve", "--dns-addr", "127.0.0.1:70000"}, want: `--dns-addr "127.0.0.1:70000"`},
		// A negative bound was silently no limit (or a contradictory
		// message): only -1, on a bound that says "-1: no limit".
		{args: []string{"serve", "--http-max-connections", "-1"}, want: "--http-max-connections -1: a bound is a positive number (leave it out for its default"},
		{args: []string{"serve", "--max-registrations", "-2"}, want: "--max-registrations -2: a bound is a positive number"},
		{args: []string{"serve", "--max-watches-per-client", "-1"}, want: "--max-watches-per-client -1: a bound is a positive number"},
		{args: []string{"serve", "--max-watches", "-4"}, want: "--max-watches -4: a bound is a positive number, or -1 for no limit"},
		{args: []string{"proxy", "--max-watchers", "-2"}, want: "--max-watchers -2: a bound is a positive number, or -1 for no limit"},
		{args: []string{"proxy", "--max-watch-waiting-bytes", "-5"}, want: "--max-watch-waiting-bytes -5"},
		// Client certificates asked for without TLS were silently not
		// asked for.
		{args: []string{"proxy", "--client-cert-auth", "--endpoints", "http://127.0.0.1:1"}, want: "--client-cert-auth needs --trusted-ca-file"},
		// Two listeners on one address: the second failed at start as
		// "is another beacon serve running?".
		{args: []string{"serve", "--http-addr", "127.0.0.1:31999", "--xds-addr", "127.0.0.1:31999"}, want: "--http-addr and --xds-addr are both 127.0.0.1:31999: give each its own port"},
		{args: []string{"serve", "--auth-token-ttl", "0"}, want: "--auth-token-ttl"},
		{args: []string{"serve", "--auto-compaction-retention", "1ns"}, want: "--auto-compaction-retention 1ns: keep at least 1s of history (0 keeps every revision)"},
		// A silence timeout too short benched healthy members.
		{args: []string{"proxy", "--watch-silence-timeout", "20ms", "--endpoints", "http://127.0.0.1:1"}, want: "--watch-silence-timeout 20ms: at least 1s"},
		{args: []string{"proxy", "--keepalive-silence-timeout", "1ns", "--endpoints", "http://127.0.0.1:1"}, want: "--keepalive-silence-timeout 1ns: at least 100ms"},
		// Zero would silently be the default (256).
		{args: []string{"serve", "--http-max-connections-per-client", "0"}, want: "--http-max-connections-per-client 0: give the most HTTP connections"},
		{args: []string{"serve", "--auto-compaction-retention", "weekly"}, want: `--auto-compaction-retention "weekly": want a duration such as 5m or 1h, a number of hours, or 0 to keep every revision`},
		{args: []string{"serve", "--auto-compaction-retention", "-1h"}, want: `--auto-compaction-retention "-1h": must not be negative`},
		{args: []string{"serve", "--auto-compaction-retention", "10ms"}, want: "--auto-compaction-retention 10ms: keep at least 1s of history"},
		// -1s was accepted and meant SERVFAIL at once, which 0s says.
		{args: []string{"serve", "--dns-max-stale", "-1s"}, want: "--dns-max-stale -1s: must not be negative (0s: SERVFAIL at once)"},
		{args: []string{"serve", "--etcd-endpoints", "http://127.0.0.1:1", "--auto-compaction-retention", "1h"}, want: "--auto-compaction-retention applies to the embedded etcd only"},
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
	b = startBeacon(t, t.TempDir(), nil, "--version")
	if err := b.wait(t, 30*time.Second); err != nil || !strings.HasPrefix(b.out(), "beacon ") || !strings.Contains(b.out(), "go.etcd.io/etcd/server/v3") {
		t.Fatalf("--version: %v %q", err, b.out())
	}
	b = startBeacon(t, t.TempDir(), nil, "version", "-o", "json")
	var v versionInfo
	if err := b.wait(t, 30*time.Second); err != nil || json.Unmarshal([]byte(b.out()), &v) != nil || v.Go == "" || v.Deps["go.etcd.io/etcd/server/v3"] == "" {
		t.Fatalf("version -o json: %v %q", err, b.out())
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

// badInput is a command line that must fail.
type badInput struct {
	args []string
	want string // in the error; "" for any
	// exit is the expected exit status: 2 (bad usage) when zero.
	exit int
	// env is added to the environment.
	env []string
}

// checkBadInput runs each command line in its own child process and checks
// that it exits with the expected status and exactly one line of error,
// "beacon: ...", containing want. serve and proxy get free ports for every
// listener the command line leaves to its default: a command line that is
// wrongly accepted must not take a default port.
func checkBadInput(t *testing.T, tests []badInput) {
	t.Helper()
	for _, tt := range tests {
		args := withFreePorts(t, tt.args, tt.env)
		b := startBeacon(t, t.TempDir(), tt.env, args...)
		if err := b.wait(t, 30*time.Second); err == nil {
			t.Errorf("%v: exit status 0", tt.args)
			continue
		}
		want := tt.exit
		if want == 0 {
			want = exitUsage
		}
		stderr := strings.TrimSpace(b.errOut())
		if code := b.exitCode(); code != want {
			t.Errorf("%v: exit status %d, want %d (stderr %q)", tt.args, code, want, stderr)
		}
		if !strings.Contains(stderr, tt.want) || !strings.HasPrefix(stderr, "beacon: ") || strings.Contains(stderr, "\n") ||
			strings.Count(stderr, "beacon: ") != 1 {
			t.Errorf("%v: stderr %q, want one 'beacon: ' line containing %q", tt.args, stderr, tt.want)
		}
	}
}

// withFreePorts adds free ports for the listeners of serve and proxy that
// args (or env) do not set, and a dead endpoint for a proxy given no
// cluster: a command line wrongly accepted must neither take a default
// port nor reach whatever listens on one.
func withFreePorts(t *testing.T, args, env []string) []string {
	t.Helper()
	if len(args) == 0 {
		return args
	}
	has := func(flag string) bool {
		for _, a := range args {
			if a == flag || strings.HasPrefix(a, flag+"=") || (strings.HasPrefix(flag, "--discovery") && strings.HasPrefix(a, flag)) {
				return true
			}
		}
		return false
	}
	hasEnv := func(name string) bool {
		for _, e := range env {
			if strings.HasPrefix(e, name+"=") {
				return true
			}
		}
		return false
	}
	out := append([]string(nil), args...)
	var need []string
	switch args[0] {
	case "serve":
		need = []string{"--listen-client-urls", "--listen-peer-urls", "--http-addr", "--dns-addr", "--xds-addr"}
	case "proxy":
		if !hasEnv("BEACON_PROXY_LISTEN") {
			need = []string{"--listen-addr"}
		}
		if !has("--endpoints") && !has("--initial-cluster") && !has("--discovery") {
			out = append(out, "--endpoints", freeURL(t))
		}
	}
	for _, flag := range need {
		if has(flag) {
			continue
		}
		u := freeURL(t)
		if flag == "--http-addr" || flag == "--listen-addr" || flag == "--dns-addr" || flag == "--xds-addr" {
			u = strings.TrimPrefix(u, "http://")
		}
		out = append(out, flag, u)
	}
	return out
}
