package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/beaconplane/beacon/internal/testkit/testpeer"
	"github.com/beaconplane/beacon/server"
	"github.com/beaconplane/beacon/server/dnsapi"
	"github.com/beaconplane/beacon/server/xdsapi"
	"github.com/miekg/dns"
)

// The README's set-up runs `go run ./cmd/beacon serve` (every default:
// 127.0.0.1:2379, 2380 and 9379, ./beacon.data) beside `go test ./...`.
// No test may hold a default port, since that serve, or an etcd installed
// as a service, holds them while the tests run. So TestReadmeServeCommand
// runs `beacon serve` with every default inside a network namespace of its
// own (as root, which CI is), where the defaults are free whatever the
// machine runs; without root it runs serve on free ports and checks the
// defaults another way, and says so in the log.

// readmeNetnsEnv marks the child test process that runs inside the new
// network namespace.
const readmeNetnsEnv = "BEACON_TEST_README_NETNS"

// The defaults the README documents.
const (
	readmeClientURL = "http://127.0.0.1:2379"
	readmePeerURL   = "http://127.0.0.1:2380"
	readmeHTTPAddr  = "127.0.0.1:9379"
	readmeDNSAddr   = "127.0.0.1:9353"
	readmeXDSAddr   = "127.0.0.1:9380"
	readmeDataDir   = "beacon.data"
)

// TestReadmeServeCommand runs the README's `beacon serve`, with every
// default, as root in a network namespace of its own where the default
// ports are free. Without root (or where namespaces are not permitted) it
// skips, saying why, and fails under BEACON_REQUIRE_PEERS; the defaults are
// then still checked as values by TestReadmeDefaultValues.
func TestReadmeServeCommand(t *testing.T) {
	if os.Getenv(readmeNetnsEnv) == "1" {
		// Inside the namespace: loopback is down in a new one.
		if err := loopbackUp(); err != nil {
			t.Fatalf("bring loopback up in the new network namespace: %v", err)
		}
		checkServeDefaults(t)
		return
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, cmd := range []string{"go run ./cmd/beacon serve", "go test ./..."} {
		if !bytes.Contains(readme, []byte(cmd)) {
			t.Fatalf("README.md no longer gives %q", cmd)
		}
	}
	if os.Geteuid() != 0 {
		testpeer.Missing(t, fmt.Sprintf("not root (uid %d): cannot make a network namespace to bind the default ports in; "+
			"TestReadmeDefaultValues checks them as values", os.Geteuid()))
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := testpeer.Command(exe, "-test.run=^TestReadmeServeCommand$", "-test.v", "-test.timeout=3m")
	cmd.Env = append(os.Environ(), readmeNetnsEnv+"=1")
	cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWNET
	out, err := cmd.CombinedOutput()
	var perr *os.PathError
	if err != nil && (errorsAsPath(err, &perr) || strings.Contains(err.Error(), "operation not permitted")) {
		testpeer.Missing(t, fmt.Sprintf("cannot make a network namespace (%v): TestReadmeDefaultValues checks the defaults as values", err))
	}
	t.Logf("beacon serve with every default, in a network namespace of its own:\n%s", out)
	if err != nil {
		t.Fatalf("in the network namespace: %v", err)
	}
}

// TestReadmeDefaultValues: the default ports and data directory are the
// same where they are set (package server), shown (serve --help) and
// documented (the README); a run on free ports checks the rest. It runs
// everywhere; TestReadmeServeCommand binds the defaults where it can.
func TestReadmeDefaultValues(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	checkDefaultValues(t, string(readme))
}

func errorsAsPath(err error, target **os.PathError) bool {
	pe, ok := err.(*os.PathError) //nolint:errorlint // exec returns it unwrapped
	if ok {
		*target = pe
	}
	return ok
}

// checkServeDefaults runs `beacon serve` with no flag in a fresh directory
// and checks that etcd clients, etcd peers and the HTTP API answer on the
// documented default ports, that the banner says so, that the data goes
// to ./beacon.data, and that Ctrl-C stops it cleanly, logging nothing at
// WARN or ERROR.
func checkServeDefaults(t *testing.T) {
	dir := t.TempDir()
	b := startBeacon(t, dir, nil, "serve")
	b.waitLine(t, "beacon serve is ready", 60*time.Second)
	b.waitLine(t, "HTTP API", 5*time.Second)
	for _, want := range []string{readmeClientURL, readmePeerURL, "http://" + readmeHTTPAddr, readmeDataDir} {
		if !strings.Contains(b.out(), want) {
			t.Errorf("banner lacks %s:\n%s", want, b.out())
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, url := range []string{readmeClientURL + "/health", "http://" + readmeHTTPAddr + "/readyz"} {
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
	if r, _, err := (&dns.Client{Net: "tcp", Timeout: 10 * time.Second}).ExchangeContext(ctx, soa, readmeDNSAddr); err != nil || r.Rcode != dns.RcodeSuccess {
		t.Errorf("DNS on %s: %v %v", readmeDNSAddr, r, err)
	}
	for what, addr := range map[string]string{"etcd peer": strings.TrimPrefix(readmePeerURL, "http://"), "xDS": readmeXDSAddr} {
		conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Errorf("%s port: %v", what, err)
		} else {
			conn.Close()
		}
	}
	if !strings.Contains(b.out(), "xDS           "+readmeXDSAddr) {
		t.Errorf("banner lacks the xDS listener %s:\n%s", readmeXDSAddr, b.out())
	}
	if fi, err := os.Stat(dir + "/" + readmeDataDir + "/member"); err != nil || !fi.IsDir() {
		t.Errorf("no member in ./%s: %v", readmeDataDir, err)
	}
	_ = b.cmd.Process.Signal(syscall.SIGINT)
	if err := b.wait(t, 30*time.Second); err != nil {
		t.Fatalf("exit after SIGINT: %v\n%s", err, b.errOut())
	}
	t.Logf("`beacon serve` printed:\n%s", b.out())
	checkQuietLog(t, b.errOut())
}

// checkQuietLog fails on any WARN or ERROR line: a clean start and stop
// log none.
func checkQuietLog(t *testing.T, stderr string) {
	t.Helper()
	complaints, load := quietLogComplaints(stderr)
	for _, l := range load {
		t.Logf("etcd under load (not a complaint of the start): %s", l)
	}
	for _, l := range complaints {
		t.Errorf("a clean start and stop logged: %s", l)
	}
}

// quietLogComplaints returns the WARN and ERROR lines of a log, apart from
// etcd's warnings that the machine is slow (etcdLoadWarning), which it
// returns separately: a busy machine, not a complaint about the start.
func quietLogComplaints(stderr string) (complaints, load []string) {
	for _, l := range strings.Split(stderr, "\n") {
		rec, ok := parseLogLine(l)
		switch {
		case !ok || (rec.level != "WARN" && rec.level != "ERROR"):
		case etcdLoadWarning(rec):
			load = append(load, l)
		default:
			complaints = append(complaints, l)
		}
	}
	return complaints, load
}

// logRecord is what checkQuietLog reads of a log line.
type logRecord struct{ level, msg, component string }

// textLogField matches one key=value of slog's text format (the value
// quoted or not).
var textLogField = regexp.MustCompile(`(?:^|\s)(level|msg|component)=("(?:[^"\\]|\\.)*"|\S*)`)

// parseLogLine reads a line of beacon's log, in either --log-format: a
// JSON object, or slog's key=value text.
func parseLogLine(l string) (logRecord, bool) {
	l = strings.TrimSpace(l)
	if strings.HasPrefix(l, "{") {
		var rec struct{ Level, Msg, Component string }
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			return logRecord{}, false
		}
		return logRecord{rec.Level, rec.Msg, rec.Component}, true
	}
	var rec logRecord
	for _, m := range textLogField.FindAllStringSubmatch(l, -1) {
		v := m[2]
		if uq, err := strconv.Unquote(v); err == nil {
			v = uq
		}
		switch m[1] {
		case "level":
			rec.level = v
		case "msg":
			rec.msg = v
		case "component":
			rec.component = v
		}
	}
	return rec, rec.level != ""
}

// etcdLoadWarnings are the warnings embedded etcd logs when the machine is
// slow (a disk sync, a request, a heartbeat taking longer than it
// expects), whatever Beacon does: on a busy machine a clean start can log
// them.
var etcdLoadWarnings = map[string]bool{
	"slow fdatasync":                                         true,
	"apply request took too long":                            true,
	"apply entries took too long":                            true,
	"waiting for ReadIndex response took too long, retrying": true,
	"timed out waiting for read index response (local node might have slow network)":                         true,
	"leader failed to send out heartbeat on time; took too long, leader is overloaded likely from slow disk": true,
}

// etcdLoadWarning reports whether rec is one of etcdLoadWarnings, logged
// by embedded etcd (component etcd) at WARN: only that, not any line that
// mentions one.
func etcdLoadWarning(rec logRecord) bool {
	return rec.component == "etcd" && rec.level == "WARN" && etcdLoadWarnings[rec.msg]
}

// checkDefaultValues is the check without a namespace: serve runs on free
// ports, and the defaults are checked as values where they are set
// (package server), shown (serve --help) and documented (the README).
func checkDefaultValues(t *testing.T, readme string) {
	for got, want := range map[string]string{
		server.DefaultClientURL: readmeClientURL, server.DefaultPeerURL: readmePeerURL,
		server.DefaultHTTPAddr: readmeHTTPAddr, server.DefaultDataDir: readmeDataDir, dnsapi.DefaultAddr: readmeDNSAddr,
		xdsapi.DefaultAddr: readmeXDSAddr,
	} {
		if got != want {
			t.Errorf("server default %q, the README documents %q", got, want)
		}
	}
	if !strings.Contains(readme, strings.TrimPrefix(readmeClientURL, "http://")) || !strings.Contains(readme, readmeHTTPAddr) ||
		!strings.Contains(readme, readmeXDSAddr) {
		t.Errorf("README does not document the default ports %s, %s and %s", readmeClientURL, readmeHTTPAddr, readmeXDSAddr)
	}
	help := startBeacon(t, t.TempDir(), nil, "serve", "--help")
	if err := help.wait(t, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{readmeClientURL, readmePeerURL, readmeHTTPAddr, readmeDataDir, readmeDNSAddr, readmeXDSAddr} {
		if !strings.Contains(help.out(), want) {
			t.Errorf("serve --help does not show the default %s", want)
		}
	}
	client, peer, httpURL := freeURL(t), freeURL(t), freeURL(t)
	b := startBeacon(t, t.TempDir(), nil, "serve", "--listen-client-urls", client, "--listen-peer-urls", peer,
		"--http-addr", strings.TrimPrefix(httpURL, "http://"), "--dns-addr", strings.TrimPrefix(freeURL(t), "http://"),
		"--xds-addr", strings.TrimPrefix(freeURL(t), "http://"))
	b.waitLine(t, "beacon serve is ready", 60*time.Second)
	_ = b.cmd.Process.Signal(syscall.SIGINT)
	if err := b.wait(t, 30*time.Second); err != nil {
		t.Fatalf("exit after SIGINT: %v\n%s", err, b.errOut())
	}
	checkQuietLog(t, b.errOut())
}

// loopbackUp sets the loopback interface up (SIOCSIFFLAGS), as
// `ip link set lo up` does.
func loopbackUp() error {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_DGRAM, 0)
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	var ifr struct {
		name  [syscall.IFNAMSIZ]byte
		flags uint16
		_     [22]byte
	}
	copy(ifr.name[:], "lo")
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), syscall.SIOCGIFFLAGS, uintptr(unsafe.Pointer(&ifr))); e != 0 {
		return e
	}
	ifr.flags |= syscall.IFF_UP | syscall.IFF_RUNNING
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), syscall.SIOCSIFFLAGS, uintptr(unsafe.Pointer(&ifr))); e != 0 {
		return e
	}
	return nil
}

// TestReadmeTourHTTP runs the HTTP part of the README's tour as written,
// with bash and curl, against a `beacon serve` on free ports: register,
// heartbeat with the secret the registration returned, list, watch,
// deregister. Every request must succeed (curl --fail-with-body).
func TestReadmeTourHTTP(t *testing.T) {
	curl := testpeer.Binary(t, "apt-get install curl", "curl")
	bash := testpeer.Binary(t, "apt-get install bash", "bash")
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, tour, ok := strings.Cut(string(readme), "## A tour in five minutes")
	if !ok {
		t.Fatal("README.md has no tour")
	}
	var cmds []string // the tour's curl commands, continuation lines joined
	var cur string
	for _, line := range strings.Split(tour, "\n") {
		if strings.HasPrefix(line, "## ") {
			break
		}
		if cur == "" && !strings.Contains(line, "curl ") {
			continue
		}
		cur += line + "\n"
		code, _, _ := strings.Cut(line, " #")
		if t := strings.TrimSpace(code); strings.HasSuffix(t, "\\") || strings.HasSuffix(t, "|") {
			continue
		}
		cmds = append(cmds, cur)
		cur = ""
	}
	if len(cmds) < 5 || !strings.Contains(strings.Join(cmds, ""), "/heartbeat") {
		t.Fatalf("the tour's HTTP part (%d commands) registers and heartbeats no more:\n%s", len(cmds), strings.Join(cmds, ""))
	}

	client, peer, httpURL := freeURL(t), freeURL(t), freeURL(t)
	addr := strings.TrimPrefix(httpURL, "http://")
	b := startBeacon(t, t.TempDir(), nil, "serve", "--listen-client-urls", client, "--listen-peer-urls", peer,
		"--http-addr", addr, "--dns-addr=")
	b.waitLine(t, "beacon serve is ready", 60*time.Second)

	var script strings.Builder
	script.WriteString("set -u\n")
	for i, c := range cmds {
		c = strings.ReplaceAll(c, "127.0.0.1:9379", addr)
		c = strings.ReplaceAll(c, "curl -sN ", curl+" -sSN --fail-with-body --max-time 2 ")
		c = strings.ReplaceAll(c, "curl -s ", curl+" -sS --fail-with-body --max-time 10 ")
		fmt.Fprintf(&script, "%s\necho \"#%d rc=$?\"\n", strings.TrimRight(c, "\n"), i)
	}
	out, err := testpeer.Command(bash, "-c", script.String()).CombinedOutput()
	if err != nil {
		t.Fatalf("the tour's commands: %v\n%s", err, out)
	}
	for i, c := range cmds {
		want := fmt.Sprintf("#%d rc=0", i)
		if strings.Contains(c, "curl -sN") {
			want = fmt.Sprintf("#%d rc=28", i) // a stream, ended by --max-time
		}
		if !strings.Contains(string(out), want) {
			t.Errorf("tour command %d failed (want %q):\n%s\noutput:\n%s", i, want, c, out)
		}
	}
	for _, want := range []string{`"ttl_seconds":10`, `"instances":[{`, "event: snapshot"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the tour's output lacks %s:\n%s", want, out)
		}
	}
	_ = b.cmd.Process.Signal(syscall.SIGINT)
	_ = b.wait(t, 30*time.Second)
}

// TestDocsQuoteURLsWithQuery: in the README and docs/, every URL with a
// query in a shell command is quoted (zsh takes an unquoted ? for a glob
// and refuses the command).
func TestDocsQuoteURLsWithQuery(t *testing.T) {
	files, _ := filepath.Glob("../../docs/*.md")
	files = append(files, "../../README.md")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		inCode := false
		for i, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "```") {
				inCode = !inCode
				continue
			}
			if !inCode || !strings.Contains(line, "curl ") {
				continue
			}
			for _, w := range unquotedWords(line) {
				if strings.Contains(w, "?") {
					t.Errorf("%s:%d: quote %q (zsh takes ? for a glob): %s", strings.TrimPrefix(f, "../../"), i+1, w, strings.TrimSpace(line))
				}
			}
		}
	}
}

// unquotedWords returns the parts of a shell line outside quotes, up to a
// comment.
func unquotedWords(line string) []string {
	var words []string
	var cur strings.Builder
	quote := rune(0)
	for _, r := range line {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			}
		case r == '\'' || r == '"':
			quote = r
		case r == '#' && cur.Len() == 0:
			return words
		case r == ' ' || r == '\t':
			if cur.Len() > 0 {
				words = append(words, cur.String())
				cur.Reset()
			}
		default:
			cur.WriteRune(r)
		}
	}
	if cur.Len() > 0 {
		words = append(words, cur.String())
	}
	return words
}

// TestQuietLogToleratesEtcdLoad: etcd's "slow fdatasync" on a busy machine
// failed TestLogFormatJSON as a complaint of a clean start. The check
// passes etcd's load warnings (by logger, level and message, in either log
// format) and nothing else: the same message from another component or at
// ERROR, or any other warning, is still a complaint.
func TestQuietLogToleratesEtcdLoad(t *testing.T) {
	for line, complaint := range map[string]bool{
		`time=2026-12-01T10:00:00Z level=WARN msg="slow fdatasync" component=etcd took=1.5s expected-duration=1s`:                                            false,
		`{"time":"2026-12-01T10:00:00Z","level":"WARN","msg":"slow fdatasync","component":"etcd","took":"1.5s","expected-duration":"1s"}`:                    false,
		`time=2026-12-01T10:00:00Z level=WARN msg="apply request took too long" component=etcd took=120ms`:                                                   false,
		`{"level":"WARN","msg":"leader failed to send out heartbeat on time; took too long, leader is overloaded likely from slow disk","component":"etcd"}`: false,
		`time=2026-12-01T10:00:00Z level=ERROR msg="slow fdatasync" component=etcd`:                                                                          true,
		`time=2026-12-01T10:00:00Z level=WARN msg="slow fdatasync" component=registry`:                                                                       true,
		`{"level":"WARN","msg":"slow fdatasync, and something else","component":"etcd"}`:                                                                     true,
		`time=2026-12-01T10:00:00Z level=WARN msg="cluster not reachable yet" component=etcd`:                                                                true,
		`time=2026-12-01T10:00:00Z level=WARN msg="store not reachable; waiting for it until interrupted" err="slow fdatasync"`:                              true,
		`time=2026-12-01T10:00:00Z level=INFO msg="beacon serve ready"`:                                                                                      false,
	} {
		complaints, _ := quietLogComplaints(line + "\n")
		if got := len(complaints) == 1; got != complaint {
			t.Errorf("%s: complaint %v, want %v", line, got, complaint)
		}
	}
}
