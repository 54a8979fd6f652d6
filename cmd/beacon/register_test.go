package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"github.com/beaconplane/beacon/internal/testkit/healthtest"
	"github.com/beaconplane/beacon/internal/testkit/testpeer"
	etcdstore "github.com/beaconplane/beacon/store/etcd"
)

// TestRegisterLsWatch runs the registry commands against a real etcd:
// watch sees the snapshot, the registration and the removal; ls lists it as
// a table and as JSON; register deregisters on SIGINT.
func TestRegisterLsWatch(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	ep := srv.Endpoint()
	dir := t.TempDir()

	w := startBeacon(t, dir, nil, "watch", "prod", "--endpoints", ep)
	w.waitLine(t, "synced   0 instance(s)", 30*time.Second)

	reg := startBeacon(t, dir, nil, "register", "prod/api/http", "--addr", "10.0.0.5:8080", "--meta", "zone=a",
		"--meta", "weight=10", "--transport", "http", "--ttl", "5s", "--endpoints", ep)
	line := reg.waitLine(t, "registered prod/api/http/", 30*time.Second)
	id := regexp.MustCompile(`prod/api/http/([0-9a-f]{16})`).FindStringSubmatch(line)
	if id == nil {
		t.Fatalf("no instance ID in %q", line)
	}
	added := w.waitLine(t, "added", 10*time.Second)
	if !strings.Contains(added, id[1]) || !strings.Contains(added, "10.0.0.5:8080") || !strings.Contains(added, "weight=10,zone=a") {
		t.Fatalf("watch printed %q", added)
	}

	ls := startBeacon(t, dir, nil, "ls", "prod/api", "--endpoints", ep)
	if err := ls.wait(t, 30*time.Second); err != nil {
		t.Fatalf("ls: %v\n%s", err, ls.errOut())
	}
	for _, want := range []string{"INSTANCE", "prod/api/http/" + id[1], "10.0.0.5:8080", "http", "serving", "weight=10,zone=a"} {
		if !strings.Contains(ls.out(), want) {
			t.Fatalf("ls table lacks %q:\n%s", want, ls.out())
		}
	}
	lsj := startBeacon(t, dir, nil, "ls", "prod", "-o", "json", "--endpoints", ep)
	if err := lsj.wait(t, 30*time.Second); err != nil {
		t.Fatalf("ls -o json: %v\n%s", err, lsj.errOut())
	}
	var listing struct {
		Revision  int64 `json:"revision"`
		Instances []struct {
			ID       string            `json:"id"`
			Address  string            `json:"address"`
			Metadata map[string]string `json:"metadata"`
			Status   string            `json:"status"`
		} `json:"instances"`
	}
	if err := json.Unmarshal([]byte(lsj.out()), &listing); err != nil {
		t.Fatalf("ls -o json: %v\n%s", err, lsj.out())
	}
	if listing.Revision == 0 || len(listing.Instances) != 1 || listing.Instances[0].ID != id[1] ||
		listing.Instances[0].Metadata["zone"] != "a" || listing.Instances[0].Status != "serving" {
		t.Fatalf("ls -o json = %+v", listing)
	}

	if err := reg.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	reg.waitLine(t, "deregistered prod/api/http/"+id[1], 10*time.Second)
	if err := reg.wait(t, 10*time.Second); err != nil {
		t.Fatalf("register exited with %v after SIGINT\n%s", err, reg.errOut())
	}
	removed := w.waitLine(t, "removed", 10*time.Second)
	if !strings.Contains(removed, id[1]) {
		t.Fatalf("watch printed %q", removed)
	}
	if err := w.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if err := w.wait(t, 10*time.Second); err != nil {
		t.Fatalf("watch exited with %v after SIGINT\n%s", err, w.errOut())
	}
	checkQuietLog(t, reg.errOut())
	checkQuietLog(t, w.errOut())
}

// TestWatchJSONAndDrain: watch -o json prints one object per line; register
// --drain advertises draining before removing the instance.
func TestWatchJSONAndDrain(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	ep := srv.Endpoint()
	dir := t.TempDir()
	w := startBeacon(t, dir, nil, "watch", "-o", "json", "--endpoints", ep)
	w.waitLine(t, `"kind":"synced"`, 30*time.Second)
	reg := startBeacon(t, dir, nil, "register", "prod/llm/generate", "--addr", "10.0.0.6:9000", "--id", "00000000000000b1",
		"--drain", "200ms", "-o", "json", "--endpoints", ep)
	reg.waitLine(t, `"event":"registered"`, 30*time.Second)
	var ev struct {
		Kind     string `json:"kind"`
		Type     string `json:"type"`
		Revision int64  `json:"revision"`
		Instance struct {
			ID     string `json:"id"`
			Status string `json:"status"`
		} `json:"instance"`
	}
	if err := json.Unmarshal([]byte(w.waitLine(t, `"type":"added"`, 10*time.Second)), &ev); err != nil {
		t.Fatal(err)
	}
	if ev.Kind != "changes" || ev.Instance.ID != "00000000000000b1" || ev.Revision == 0 {
		t.Fatalf("added line %+v", ev)
	}
	if err := reg.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(w.waitLine(t, `"type":"updated"`, 10*time.Second)), &ev); err != nil {
		t.Fatal(err)
	}
	if ev.Instance.Status != "draining" {
		t.Fatalf("updated line %+v, want draining", ev)
	}
	if l := reg.waitLine(t, `"event":"draining"`, 10*time.Second); !strings.Contains(l, `"status":"draining"`) {
		t.Fatalf("register's draining line %s, want the instance as advertised: draining", l)
	}
	w.waitLine(t, `"type":"removed"`, 10*time.Second)
	reg.waitLine(t, `"event":"deregistered"`, 10*time.Second)
	if err := reg.wait(t, 10*time.Second); err != nil {
		t.Fatalf("register: %v\n%s", err, reg.errOut())
	}
}

// TestSecondSignalCutsDrainShort: register --drain 1h, then Ctrl-C starts
// the drain; a second SIGINT, or a SIGTERM, ends it and deregisters at
// once — both were ignored for the whole hour (only SIGKILL ended it).
func TestSecondSignalCutsDrainShort(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	ep := srv.Endpoint()
	dir := t.TempDir()
	for i, second := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		id := fmt.Sprintf("00000000000000c%d", i)
		w := startBeacon(t, dir, nil, "watch", "prod/llm", "-o", "json", "--endpoints", ep)
		w.waitLine(t, `"kind":"synced"`, 30*time.Second)
		reg := startBeacon(t, dir, nil, "register", "prod/llm/generate", "--addr", "10.0.0.6:9000", "--id", id,
			"--drain", "1h", "--endpoints", ep)
		reg.waitLine(t, "registered prod/llm/generate/"+id, 30*time.Second)
		w.waitLine(t, `"type":"added"`, 10*time.Second)
		if err := reg.cmd.Process.Signal(syscall.SIGINT); err != nil {
			t.Fatal(err)
		}
		if l := reg.waitLine(t, "draining prod/llm/generate/"+id, 10*time.Second); !strings.Contains(l, "Ctrl-C again") {
			t.Errorf("the draining line does not say how to cut it short: %q", l)
		}
		w.waitLine(t, `"status":"draining"`, 10*time.Second)
		if err := reg.cmd.Process.Signal(second); err != nil {
			t.Fatal(err)
		}
		reg.waitLine(t, "drain of prod/llm/generate/"+id+" cut short", 30*time.Second)
		reg.waitLine(t, "deregistered prod/llm/generate/"+id, 30*time.Second)
		w.waitLine(t, `"type":"removed"`, 30*time.Second)
		if err := reg.wait(t, 30*time.Second); err != nil {
			t.Fatalf("register after %v: %v\n%s", second, err, reg.errOut())
		}
		_ = w.cmd.Process.Signal(syscall.SIGINT)
		if err := w.wait(t, 30*time.Second); err != nil {
			t.Fatalf("watch: %v\n%s", err, w.errOut())
		}
	}
}

// TestRegisterWaitsForTheStore: register started before its store keeps
// trying, saying so ("state waiting", a log line with the reason), and
// registers once the store answers — it exited after the 2 s dial timeout,
// so a worker started before its cluster needed a supervisor loop.
// --start-timeout bounds the wait; an interrupt ends it; credentials the
// store refuses are not waited for.
func TestRegisterWaitsForTheStore(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	ep := srv.Endpoint()
	srv.Stop()
	dir := t.TempDir()
	reg := startBeacon(t, dir, nil, "register", "prod/api/http", "--addr", "10.0.0.5:8080", "--id", "00000000000000d1",
		"--endpoints", ep, "--dial-timeout", "300ms")
	reg.waitLine(t, "state waiting: ", 30*time.Second)
	waitStderr(t, reg, `store not reachable; waiting for it" until="until interrupted"`, 30*time.Second)
	if !strings.Contains(reg.errOut(), ep) {
		t.Errorf("the waiting log does not say which endpoint: %s", reg.errOut())
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	reg.waitLine(t, "registered prod/api/http/00000000000000d1", 60*time.Second)
	if err := reg.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	reg.waitLine(t, "deregistered", 30*time.Second)
	if err := reg.wait(t, 30*time.Second); err != nil {
		t.Fatalf("register: %v\n%s", err, reg.errOut())
	}

	srv.Stop()
	// Interrupted while waiting: nothing was registered, exit 0.
	intr := startBeacon(t, dir, nil, "register", "prod/api/http", "--addr", "10.0.0.5:8080", "--endpoints", ep,
		"--dial-timeout", "300ms", "-o", "json")
	intr.waitLine(t, `"state":"waiting"`, 30*time.Second)
	if err := intr.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	intr.waitLine(t, `"event":"stopped"`, 30*time.Second)
	if err := intr.wait(t, 30*time.Second); err != nil {
		t.Fatalf("register interrupted while waiting: %v\n%s", err, intr.errOut())
	}
	bounded := startBeacon(t, dir, nil, "register", "prod/api/http", "--addr", "10.0.0.5:8080", "--endpoints", ep,
		"--dial-timeout", "300ms", "--start-timeout", "1s")
	if err := bounded.wait(t, 30*time.Second); err == nil || bounded.exitCode() != exitFailure ||
		!strings.Contains(bounded.errOut(), "beacon: the store did not answer within --start-timeout 1s") ||
		!strings.Contains(bounded.errOut(), "connection refused") {
		t.Fatalf("register --start-timeout 1s without a store: %v\n%s", err, bounded.errOut())
	}
	checkBadInput(t, []badInput{
		{args: []string{"register", "prod/api/http", "--addr", "10.0.0.5:8080", "--start-timeout", "-1s"}, want: "--start-timeout -1s: must not be negative"},
	})

	// Refused credentials are an answer: no waiting.
	auth := etcdtest.Start(t, etcdtest.Options{User: "root", Password: "s3cret"})
	checkBadInput(t, []badInput{
		{args: []string{"register", "prod/api/http", "--addr", "10.0.0.5:8080", "--endpoints", auth.Endpoint(), "--user", "root:wrong"},
			want: "authenticate", exit: exitFailure},
	})
}

// TestWatchFromFutureRevision: watch --from-revision beyond the store's
// revision (one it never gave) is bad usage saying so; it printed a fresh
// snapshot as if resuming had worked.
func TestWatchFromFutureRevision(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	checkBadInput(t, []badInput{
		{args: []string{"watch", "prod", "--from-revision", "99999999", "--endpoints", srv.Endpoint()},
			want: "--from-revision 99999999: invalid argument: watch from revision 99999999: the store is only at revision"},
	})
}

// TestRegistryCommandsBadInput: bad input fails with one clear line and a
// non-zero exit, before touching the network.
func TestRegistryCommandsBadInput(t *testing.T) {
	checkBadInput(t, []badInput{
		{args: []string{"register", "prod/api", "--addr", "10.0.0.1:80"}, want: "want namespace/component/endpoint"},
		{args: []string{"register", "prod/api/http"}, want: `required flag(s) "addr" not set`},
		{args: []string{"register", "Prod/api/http", "--addr", "10.0.0.1:80"}, want: "invalid namespace"},
		{args: []string{"register", "prod/api/http", "--addr", "nope"}, want: "invalid address"},
		{args: []string{"register", "prod/api/http", "--addr", "10.0.0.1:80", "--meta", "novalue"}, want: "--meta"},
		{args: []string{"register", "prod/api/http", "--addr", "10.0.0.1:80", "--ttl", "0s"}, want: "--ttl"},
		{args: []string{"register", "prod/api/http", "--addr", "10.0.0.1:80", "--ttl", "2h"}, want: "--ttl"},
		{args: []string{"register", "prod/api/http", "--addr", "10.0.0.1:80", "--id", "XYZ"}, want: "--id"},
		// Accepted without a word: control characters in a metadata value,
		// and a host name DNS cannot carry.
		{args: []string{"register", "prod/api/http", "--addr", "10.0.0.1:80", "--meta", "note=two\nlines"}, want: `metadata value for note "two\nlines": must not contain control characters`},
		{args: []string{"register", "prod/api/http", "--addr", "10.0.0.1:80", "--meta", "note=a\x00b"}, want: "must not contain control characters"},
		{args: []string{"register", "prod/api/http", "--addr", strings.Repeat("h", 254) + ":80"}, want: "host name label of 254 bytes"},
		{args: []string{"register", "prod/api/http", "--addr", "10.0.0.1:80", "-o", "yaml"}, want: "-o"},
		{args: []string{"ls", "a/b/c/d"}, want: "invalid query"},
		{args: []string{"ls", "-o", "yaml"}, want: "-o"},
		{args: []string{"ls", "--root", "beacon"}, want: "--root"},
		{args: []string{"ls", "--backend", "zookeeper"}, want: "unknown"},
		{args: []string{"watch", "--from-revision", "-1"}, want: "--from-revision"},
		{args: []string{"watch", "prod", "extra"}, want: "accepts at most 1 arg"},
		{args: []string{"ls", "--endpoints", "http://127.0.0.1:1", "--timeout", "1s"}, want: "did not answer", exit: exitFailure},
	})
}

// TestLsMemoryBackend: BEACON_DISCOVERY_BACKEND=memory works (a
// process-local, empty registry).
func TestLsMemoryBackend(t *testing.T) {
	b := startBeacon(t, t.TempDir(), []string{"BEACON_DISCOVERY_BACKEND=memory"}, "ls")
	if err := b.wait(t, 30*time.Second); err != nil {
		t.Fatalf("ls with the memory backend: %v\n%s", err, b.errOut())
	}
	if !strings.Contains(b.out(), "(no instances)") {
		t.Fatalf("ls printed %q", b.out())
	}
}

// TestTerminalOutputIsEscaped: what registrants choose (metadata, an
// address, a member's name) reaches a terminal with its control and format
// characters escaped: an escape sequence, a forged line or a bidi override
// in a metadata value printed raw by beacon ls recoloured the terminal,
// added lines or reordered text.
func TestTerminalOutputIsEscaped(t *testing.T) {
	in := beacon.Instance{Namespace: "prod", Component: "api", Endpoint: "http", ID: "00000000000000e1",
		Address: "10.0.0.1:80", Status: beacon.StatusServing, RegisteredAt: time.Now(),
		Metadata: map[string]string{"color": "\x1b[31mred\x1b[0m", "note": "a\nprod/api/http/fake 10.6.6.6:80", "file": "\u202egnp.exe", "tab": "a\tb", "zw\u200b": "x", "plain": "ünïcode ok"}}
	var out strings.Builder
	if err := writeListTable(&out, []beacon.Instance{in}, time.Now()); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{`color=\x1b[31mred\x1b[0m`, `note=a\nprod/api/http/fake 10.6.6.6:80`, `file=\u202egnp.exe`, `tab=a\tb`, `zw\u200b=x`, "plain=ünïcode ok"} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
	if strings.ContainsAny(got, "\x1b\t\u202e\u200b") || strings.Count(got, "\n") != 2 {
		t.Errorf("table holds raw control or format characters, or extra lines:\n%q", got)
	}
	if got := printable("m1\u2066=http://10.0.0.1:2380"); got != `m1\u2066=http://10.0.0.1:2380` {
		t.Errorf("printable: %q", got)
	}
}

// TestRegisterWarnsBelowElectionTTL: a TTL below registry.MinElectionTTL
// gets a warning before the registration (a JSON "warning" event with -o
// json, a "warning:" line otherwise); one at it gets none.
func TestRegisterWarnsBelowElectionTTL(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	dir := t.TempDir()
	short := startBeacon(t, dir, nil, "register", "prod/api/http", "--addr", "10.0.0.5:8080", "--ttl", "3s", "-o", "json", "--endpoints", srv.Endpoint())
	short.waitLine(t, `"event":"registered"`, 30*time.Second)
	var warning struct{ Event, Warning string }
	for _, l := range strings.Split(short.out(), "\n") {
		if strings.Contains(l, `"event":"warning"`) {
			if err := json.Unmarshal([]byte(l), &warning); err != nil {
				t.Fatal(err)
			}
		}
	}
	if !strings.Contains(warning.Warning, "below 5s, the shortest that rides out an etcd leader election") {
		t.Fatalf("no election warning for --ttl 3s:\n%s", short.out())
	}
	long := startBeacon(t, dir, nil, "register", "prod/api/http", "--addr", "10.0.0.6:8080", "--ttl", "5s", "--endpoints", srv.Endpoint())
	long.waitLine(t, "registered prod/api/http/", 30*time.Second)
	if strings.Contains(long.out(), "warning") {
		t.Fatalf("warning for --ttl 5s:\n%s", long.out())
	}
}

// TestRegisterReportsTheGrantedTTL: register says the TTL the store
// granted, not the one asked for: etcd grants at least about 2 s, so
// --ttl 1s is reported as 2s (before, "ttl 1s" while the lease had 2);
// and it warns of routing metadata no one reads.
func TestRegisterReportsTheGrantedTTL(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	p := startBeacon(t, t.TempDir(), nil, "register", "prod/api/http", "--addr", "10.0.0.7:8080", "--ttl", "1s", "--endpoints", srv.Endpoint(),
		"--meta", "priority=-1")
	line := p.waitLine(t, "registered prod/api/http/", 30*time.Second)
	if !strings.Contains(line, "ttl 2s)") {
		t.Fatalf("register --ttl 1s says %q; etcd granted 2s", line)
	}
	// Routing metadata DNS and xDS cannot read is registered with a
	// warning (the registry package's RoutingWarnings).
	if !strings.Contains(p.out(), `warning: metadata priority="-1" is not 0-65535`) {
		t.Fatalf("no warning of priority=-1:\n%s", p.out())
	}
}

// TestRegisterCheckBadInput: a bad --check or timing flag is bad usage
// naming the flag and saying what to write, before touching the network.
func TestRegisterCheckBadInput(t *testing.T) {
	reg := []string{"register", "prod/api/http", "--addr", "10.0.0.1:80"}
	with := func(args ...string) []string { return append(append([]string{}, reg...), args...) }
	checkBadInput(t, []badInput{
		{args: with("--check", "icmp"), want: `--check "icmp": invalid check "icmp": the kind must be grpc, http:/PATH, tcp or ttl:DURATION`},
		{args: with("--check", "http"), want: `--check "http": invalid check "http": an HTTP check names its path: http:/healthz`},
		{args: with("--check", "http:healthz"), want: "the HTTP path must start with /"},
		{args: with("--check", "tcp:80"), want: "a TCP check takes no argument: tcp"},
		{args: with("--check", "ttl:500ms"), want: `--check "ttl:500ms": invalid check "ttl:500ms": the TTL must be 1s..24h0m0s`},
		{args: with("--check", "ttl"), want: `--check "ttl": invalid check "ttl": a TTL check names how long a report holds: ttl:30s`},
		{args: with("--check", "ttl:30s", "--backend", "kubernetes"), want: `--check "ttl:30s": the kubernetes backend keeps no TTL reports: give the container an exec readinessProbe`},
		{args: with("--check", ""), want: `--check "": empty`},
		{args: with("--check", "ttl:30s", "--check-interval", "5s"), want: "--check-interval: a ttl check has no interval"},
		{args: with("--check", "ttl:30s", "--check-timeout", "1s"), want: "--check-timeout: a ttl check has no timeout"},
		{args: with("--check", "ttl:30s", "--check-rise", "2"), want: "--check-rise: a ttl check has no rise"},
		{args: with("--check", "ttl:30s", "--check-fall", "2"), want: "--check-fall: a ttl check has no fall"},
		{args: with("--check-interval", "5s"), want: "--check-interval: set --check too"},
		{args: with("--check", "tcp", "--check-interval", "100ms"), want: "--check-interval 100ms: invalid check \"tcp\": interval 100ms is outside 500ms..10m0s"},
		{args: with("--check", "tcp", "--check-interval", "1s", "--check-timeout", "2s"), want: "--check-timeout 2s: invalid check \"tcp\": timeout 2s must be at least 50ms and at most the interval (1s)"},
		{args: with("--check", "tcp", "--check-timeout", "20s"), want: "--check-timeout 20s:"},
		{args: with("--check", "tcp", "--check-rise", "0"), want: "--check-rise 0: 0 is not a value of this flag"},
		{args: with("--check", "tcp", "--check-rise", "101"), want: "--check-rise 101: invalid check \"tcp\": rise 101 must be 1..100"},
		{args: with("--check", "tcp", "--check-fall", "-1"), want: "--check-fall -1: invalid check \"tcp\": fall -1 must be 1..100"},
	})
}

// TestHealthColumn: beacon ls shows each instance's verdict in HEALTH:
// "-" without a check, unknown until a verdict exists, passing, failing,
// failing (panic).
func TestHealthColumn(t *testing.T) {
	at := func(id string) beacon.Instance {
		return beacon.Instance{Namespace: "prod", Component: "api", Endpoint: "http", ID: id, Address: "10.0.0.1:80",
			Status: beacon.StatusServing, RegisteredAt: time.Now()}
	}
	declared := at("00000000000000a2")
	declared.Check = &healthtest.Check
	ins := []beacon.Instance{at("00000000000000a1"), declared, healthtest.Unknown(at("00000000000000a3")),
		healthtest.Passing(at("00000000000000a4")), healthtest.Failing(at("00000000000000a5"), "refused"),
		healthtest.Panic(at("00000000000000a6"), "refused")}
	var out strings.Builder
	if err := writeListTable(&out, ins, time.Now()); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if !strings.Contains(lines[0], "STATUS   HEALTH") {
		t.Fatalf("header %q", lines[0])
	}
	col := strings.Index(lines[0], "HEALTH")
	for i, want := range []string{"-", "unknown", "unknown", "passing", "failing", "failing (panic)"} {
		if got := strings.TrimSpace(lines[i+1][col : col+len("failing (panic)")]); got != want {
			t.Errorf("row %d: HEALTH %q, want %q\n%s", i, got, want, out.String())
		}
	}
	var js strings.Builder
	if err := writeListJSON(&js, ins[4:5], 7); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(js.String(), `"health": {`) || !strings.Contains(js.String(), `"status": "failing"`) || !strings.Contains(js.String(), `"reason": "refused"`) {
		t.Errorf("ls -o json lacks the verdict:\n%s", js.String())
	}
}

// TestLsWatchShowHealth: against a real etcd, beacon watch prints each
// checked instance's verdict and a change of verdict alone as an update,
// and beacon ls shows it; register --check declares the check.
func TestLsWatchShowHealth(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	ep := srv.Endpoint()
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st, err := etcdstore.Open(ctx, etcdstore.Config{Endpoints: []string{ep}})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ks, _ := beacon.NewKeyspace("")
	put := func(in beacon.Instance) { t.Helper(); healthtest.PutAll(t, st, ks, in) }
	a := beacon.Instance{Namespace: "prod", Component: "api", Endpoint: "http", ID: "00000000000000a1", Address: "10.0.0.1:80",
		Status: beacon.StatusServing, RegisteredAt: time.Now().UTC()}
	put(healthtest.Passing(a))
	for _, id := range []string{"00000000000000b1", "00000000000000c1"} {
		// Two more that pass: one failing instance of three is below
		// the panic threshold, so it is shown failing, not in panic.
		other := a
		other.ID = id
		put(healthtest.Passing(other))
	}

	w := startBeacon(t, dir, nil, "watch", "prod", "--endpoints", ep)
	if l := w.waitLine(t, "00000000000000a1", 30*time.Second); !strings.Contains(l, "snapshot added") || !strings.Contains(l, "serving health=passing rev=") {
		t.Fatalf("snapshot line %q, want the verdict", l)
	}
	w.waitLine(t, "synced", 10*time.Second)
	put(healthtest.Failing(a, "dial tcp 10.0.0.1:80: connection refused"))
	if l := w.waitLine(t, "changes  updated", 10*time.Second); !strings.Contains(l, `serving health=failing reason="dial tcp 10.0.0.1:80: connection refused" rev=`) {
		t.Fatalf("update line %q, want the failing verdict and its reason", l)
	}

	ls := startBeacon(t, dir, nil, "ls", "prod", "--endpoints", ep)
	if err := ls.wait(t, 30*time.Second); err != nil {
		t.Fatalf("ls: %v\n%s", err, ls.errOut())
	}
	if !strings.Contains(ls.out(), "HEALTH") || !regexp.MustCompile(`prod/api/http/00000000000000a1 .* serving +failing `).MatchString(ls.out()) {
		t.Fatalf("ls:\n%s", ls.out())
	}

	reg := startBeacon(t, dir, nil, "register", "prod/api/grpc", "--addr", "10.0.0.2:90", "--check", "grpc:api.v1.Greeter",
		"--check-interval", "5s", "--check-fall", "2", "-o", "json", "--endpoints", ep)
	var line struct {
		Instance beacon.Instance `json:"instance"`
	}
	if err := json.Unmarshal([]byte(reg.waitLine(t, `"event":"registered"`, 30*time.Second)), &line); err != nil {
		t.Fatal(err)
	}
	want := beacon.Check{Kind: beacon.CheckGRPC, Service: "api.v1.Greeter", Interval: 5 * time.Second, Fall: 2}
	if line.Instance.Check == nil || *line.Instance.Check != want {
		t.Fatalf("registered check %+v, want %+v", line.Instance.Check, want)
	}
	if l := w.waitLine(t, "prod/api/grpc/", 10*time.Second); !strings.Contains(l, "serving health=unknown rev=") {
		t.Fatalf("watch line of the new registration %q, want health=unknown (no verdict yet)", l)
	}
	if err := reg.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if err := reg.wait(t, 10*time.Second); err != nil {
		t.Fatalf("register: %v\n%s", err, reg.errOut())
	}
	if err := w.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if err := w.wait(t, 10*time.Second); err != nil {
		t.Fatalf("watch: %v\n%s", err, w.errOut())
	}
}

// TestServeChecksRegistrations runs the whole path: beacon serve (embedded
// etcd, its checkers on by default), two beacon register --check tcp, one
// at an address that listens and one at an address that refuses; beacon
// watch sees the verdicts, beacon ls shows them, and DNS answers only the
// passing instance.
func TestServeChecksRegistrations(t *testing.T) {
	dir := t.TempDir()
	client := freeURL(t)
	dnsAddr := strings.TrimPrefix(freeURL(t), "http://")
	srv := startBeacon(t, dir, nil, withFreePorts(t, []string{"serve", "--data-dir", t.TempDir(), "--listen-client-urls", client,
		"--dns-addr", dnsAddr}, nil)...)
	srv.waitLine(t, "beacon serve is ready", 60*time.Second)

	up, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	go func() {
		for {
			c, err := up.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	down := strings.TrimPrefix(freeURL(t), "http://") // nothing listens there
	check := []string{"--check", "tcp", "--check-interval", "500ms", "--check-timeout", "200ms", "--check-rise", "1", "--check-fall", "1", "--endpoints", client}
	w := startBeacon(t, dir, nil, "watch", "prod", "--endpoints", client)
	w.waitLine(t, "synced", 30*time.Second)
	good := startBeacon(t, dir, nil, append([]string{"register", "prod/api/http", "--addr", up.Addr().String(), "--id", "00000000000000d1"}, check...)...)
	good.waitLine(t, "registered prod/api/http/00000000000000d1", 30*time.Second)
	bad := startBeacon(t, dir, nil, append([]string{"register", "prod/api/http", "--addr", down, "--id", "00000000000000d2"}, check...)...)
	bad.waitLine(t, "registered prod/api/http/00000000000000d2", 30*time.Second)
	// The two verdicts come in either order (stdout holds a line before
	// waitLine gets it).
	passing, failing := "00000000000000d1 "+up.Addr().String()+" serving health=passing", "00000000000000d2 "+down+" serving health=failing reason="
	for !strings.Contains(w.out(), passing) || !strings.Contains(w.out(), failing) {
		w.waitLine(t, "health=", 30*time.Second)
	}

	ls := startBeacon(t, dir, nil, "ls", "prod", "--endpoints", client)
	if err := ls.wait(t, 30*time.Second); err != nil {
		t.Fatalf("ls: %v\n%s", err, ls.errOut())
	}
	if !regexp.MustCompile(`00000000000000d1 .* passing `).MatchString(ls.out()) || !regexp.MustCompile(`00000000000000d2 .* failing `).MatchString(ls.out()) {
		t.Fatalf("ls:\n%s", ls.out())
	}
	digBin := testpeer.Binary(t, "apt-get install bind9-dnsutils", "dig")
	host, port, _ := net.SplitHostPort(dnsAddr)
	out, err := testpeer.Command(digBin, "@"+host, "-p", port, "+short", "+norecurse", "http.api.prod.beacon.", "A").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "127.0.0.1" {
		t.Fatalf("dig A http.api.prod.beacon.: %q (%v), want only the passing instance's 127.0.0.1", out, err)
	}
	for _, b := range []*child{good, bad, w, srv} {
		if err := b.cmd.Process.Signal(syscall.SIGINT); err != nil {
			t.Fatal(err)
		}
		if err := b.wait(t, 30*time.Second); err != nil {
			t.Fatalf("%v after SIGINT: %v\n%s", b.cmd.Args, err, b.errOut())
		}
	}
}
