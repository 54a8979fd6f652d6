package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/testkit/testpeer"
)

// The Dockerfile and the systemd unit are checked here, since building an
// image needs a Docker engine that CI machines may lack (.ci/run builds it
// when `docker info` works): their structure, and that the serve flags
// they pass are flags beacon serve takes (and, as root, that serve starts
// with them, in a network namespace of its own).

// dockerfile is the Dockerfile's instructions, continuation lines joined.
type instruction struct{ op, args string }

func readDockerfile(t *testing.T) []instruction {
	t.Helper()
	f, err := os.Open("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []instruction
	var cur strings.Builder
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if cur.Len() == 0 && (line == "" || strings.HasPrefix(line, "#")) {
			continue
		}
		if strings.HasSuffix(line, "\\") {
			cur.WriteString(strings.TrimSuffix(line, "\\") + " ")
			continue
		}
		cur.WriteString(line)
		op, args, _ := strings.Cut(cur.String(), " ")
		out = append(out, instruction{strings.ToUpper(op), strings.TrimSpace(args)})
		cur.Reset()
	}
	return out
}

// TestDockerfile: multi-stage, a static (CGO_ENABLED=0) build of
// ./cmd/beacon with the Go of go.mod, a final stage with no shell that
// runs as a non-root user, nothing fetched by ADD from a URL, and a CMD of
// valid serve flags that listens beyond loopback.
func TestDockerfile(t *testing.T) {
	ins := readDockerfile(t)
	var froms []string
	var final []instruction
	for _, in := range ins {
		if in.op == "FROM" {
			froms = append(froms, in.args)
			final = nil
		}
		final = append(final, in)
		if in.op == "ADD" && regexp.MustCompile(`https?://`).MatchString(in.args) {
			t.Errorf("ADD of a URL (%s): fetch nothing unpinned; COPY from the context or a stage", in.args)
		}
	}
	if len(froms) < 2 {
		t.Fatalf("%d FROM: want a build stage and a runtime stage", len(froms))
	}
	gomod, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	gover := regexp.MustCompile(`(?m)^go (\S+)$`).FindSubmatch(gomod)
	if gover == nil || !strings.Contains(froms[0], "golang:"+string(gover[1])) {
		t.Errorf("build stage %q does not use the Go of go.mod (%s)", froms[0], gover)
	}
	build := false
	for _, in := range ins {
		if in.op == "RUN" && strings.Contains(in.args, "CGO_ENABLED=0 go build") && strings.Contains(in.args, "./cmd/beacon") {
			build = true
		}
	}
	if !build {
		t.Error("no RUN CGO_ENABLED=0 go build ... ./cmd/beacon: the binary must be static")
	}
	if last := froms[len(froms)-1]; !strings.HasPrefix(last, "scratch") && !strings.Contains(last, "distroless") {
		t.Errorf("runtime stage %q: use scratch or distroless (no shell, nothing but the binary)", last)
	}
	var user, cmd, entry string
	for _, in := range final {
		switch in.op {
		case "USER":
			user = in.args
		case "CMD":
			cmd = in.args
		case "ENTRYPOINT":
			entry = in.args
		case "COPY":
			if !strings.Contains(in.args, "--from=") {
				t.Errorf("runtime stage copies from the context (%s): copy from the build stage only", in.args)
			}
		}
	}
	if u, _, _ := strings.Cut(user, ":"); u == "" || u == "0" || u == "root" {
		t.Errorf("runtime stage runs as %q: set a non-root USER", user)
	}
	var ep, args []string
	if json.Unmarshal([]byte(entry), &ep) != nil || len(ep) != 1 || !strings.HasSuffix(ep[0], "/beacon") {
		t.Errorf("ENTRYPOINT %s: want [\"/usr/local/bin/beacon\"]", entry)
	}
	if err := json.Unmarshal([]byte(cmd), &args); err != nil || len(args) == 0 || args[0] != "serve" {
		t.Fatalf("CMD %s: want the exec form of serve and its flags", cmd)
	}
	checkServeFlags(t, "Dockerfile CMD", args[1:])
	joined := strings.Join(args, " ")
	for _, want := range []string{"0.0.0.0:2379", "0.0.0.0:9379", "--advertise-client-urls", "--data-dir /var/lib/beacon"} {
		if !strings.Contains(joined, want) {
			t.Errorf("CMD lacks %s: a container must listen beyond its loopback and keep its data in the volume", want)
		}
	}
	ignore, err := os.ReadFile("../../.dockerignore")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(ignore), "\n") {
		if l := strings.TrimSpace(line); l == ".git" || l == "/.git" || l == "go.mod" || l == "*.go" {
			t.Errorf(".dockerignore excludes %s, which the build needs", l)
		}
	}
}

// TestDockerfileCMDServes runs, as root, the Dockerfile's CMD (with a
// temporary data directory) in a network namespace of its own, where its
// ports are free, and checks that it becomes ready. Without root (or
// where namespaces are not permitted) it skips, saying why, and fails under
// BEACON_REQUIRE_PEERS: it reported PASS having run nothing.
func TestDockerfileCMDServes(t *testing.T) {
	if os.Getenv(readmeNetnsEnv) == "docker" {
		if err := loopbackUp(); err != nil {
			t.Fatal(err)
		}
		var args []string
		for _, in := range readDockerfile(t) {
			if in.op == "CMD" {
				_ = json.Unmarshal([]byte(in.args), &args)
			}
		}
		for i := range args {
			if i > 0 && args[i-1] == "--data-dir" {
				args[i] = t.TempDir() + "/data"
			}
		}
		b := startBeacon(t, t.TempDir(), nil, args...)
		b.waitLine(t, "beacon serve is ready", 60*time.Second)
		_ = b.cmd.Process.Signal(syscall.SIGTERM)
		if err := b.wait(t, 30*time.Second); err != nil {
			t.Fatalf("serve with the Dockerfile's CMD: %v\n%s", err, b.errOut())
		}
		return
	}
	if os.Geteuid() != 0 {
		testpeer.Missing(t, fmt.Sprintf("not root (uid %d): cannot make the network namespace the Dockerfile's CMD runs in "+
			"with its own default ports; its flags are checked by TestDockerfile", os.Geteuid()))
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := testpeer.Command(exe, "-test.run=^TestDockerfileCMDServes$", "-test.v", "-test.timeout=3m")
	cmd.Env = append(os.Environ(), readmeNetnsEnv+"=docker")
	cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWNET
	out, err := cmd.CombinedOutput()
	if err != nil && strings.Contains(err.Error(), "operation not permitted") {
		testpeer.Missing(t, fmt.Sprintf("cannot make a network namespace (%v): the Dockerfile's CMD is checked as flags only (TestDockerfile)", err))
	}
	if err != nil {
		t.Fatalf("serve with the Dockerfile's CMD, in a network namespace: %v\n%s", err, out)
	}
}

// TestPrivilegedTestsSkipWithoutRoot: the tests that need root (a network
// namespace) skip, saying why, when run without it, and fail under
// BEACON_REQUIRE_PEERS: TestDockerfileCMDServes reported PASS having run
// nothing. As root, this runs them again as nobody (a copy of the test
// binary nobody may execute); without root, they skip by themselves.
func TestPrivilegedTestsSkipWithoutRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		testpeer.Missing(t, "not root: cannot run the privileged tests as another user (they skip by themselves here)")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	base, err := os.MkdirTemp("", "beacon-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(base) })
	bin := filepath.Join(base, "beacon.test")
	data, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		require string
		want    []string
	}{
		{"", []string{"--- SKIP: TestDockerfileCMDServes", "--- SKIP: TestReadmeServeCommand", "not root (uid 65534)"}},
		{"1", []string{"--- FAIL: TestDockerfileCMDServes", "--- FAIL: TestReadmeServeCommand", testpeer.RequireEnv + " is set"}},
	} {
		cmd := testpeer.Command(bin, "-test.run=^(TestDockerfileCMDServes|TestReadmeServeCommand)$", "-test.v")
		cmd.Env = append(os.Environ(), testpeer.RequireEnv+"="+tc.require, "HOME="+base, "TMPDIR="+base)
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: 65534, Gid: 65534}
		out, _ := cmd.CombinedOutput()
		for _, w := range tc.want {
			if !strings.Contains(string(out), w) {
				t.Errorf("as nobody, %s=%q: output lacks %q:\n%s", testpeer.RequireEnv, tc.require, w, out)
			}
		}
	}
}

// TestSystemdUnit: the unit runs beacon serve, not as root, with valid
// flags and its data in its state directory, does not restart on bad
// usage (exit 2), and is hardened.
func TestSystemdUnit(t *testing.T) {
	b, err := os.ReadFile("../../deploy/systemd/beacon.service")
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), "="); ok && !strings.HasPrefix(line, "#") {
			keys[k] = v
		}
	}
	exec := strings.Fields(keys["ExecStart"])
	if len(exec) < 2 || !strings.HasSuffix(exec[0], "/beacon") || exec[1] != "serve" {
		t.Fatalf("ExecStart %q: want beacon serve", keys["ExecStart"])
	}
	var flags []string
	for _, f := range exec[2:] {
		if !strings.HasPrefix(f, "$") {
			flags = append(flags, f)
		}
	}
	checkServeFlags(t, "ExecStart", flags)
	if !strings.Contains(keys["ExecStart"], "--data-dir /var/lib/"+keys["StateDirectory"]) {
		t.Errorf("ExecStart keeps the data outside StateDirectory %q", keys["StateDirectory"])
	}
	if keys["DynamicUser"] != "yes" && (keys["User"] == "" || keys["User"] == "root") {
		t.Error("the unit runs as root: set DynamicUser=yes or User=")
	}
	for k, want := range map[string]string{
		"Restart": "on-failure", "RestartPreventExitStatus": "2", "NoNewPrivileges": "yes", "ProtectSystem": "strict",
		"CapabilityBoundingSet": "", "KillSignal": "SIGTERM",
	} {
		if got, ok := keys[k]; !ok || got != want {
			t.Errorf("%s=%q, want %q", k, got, want)
		}
	}
	def, err := os.ReadFile("../../deploy/systemd/beacon.default")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(def), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimPrefix(line, "#"), "BEACON_SERVE_FLAGS="); ok {
			checkServeFlags(t, "beacon.default", strings.Fields(v))
		}
	}
}

// checkServeFlags parses args with beacon serve's own flags.
func checkServeFlags(t *testing.T, where string, args []string) {
	t.Helper()
	cmd := newServeCmd()
	if err := cmd.ParseFlags(args); err != nil {
		t.Errorf("%s: %v (flags %q)", where, err, args)
	}
	if rest := cmd.Flags().Args(); len(rest) > 0 {
		t.Errorf("%s: serve takes no arguments, got %q", where, rest)
	}
}

// earlyExitReader matches a pipe into a command that may stop reading before
// its writer is done: head, grep -q/-m, sed's q.
var earlyExitReader = regexp.MustCompile(`\|\s*(head\b|grep\s+(-\w*[qm]|--quiet|--max-count)|sed\s+(-n\s+)?'?\d*q)`)

// TestCIScriptsSurvivePipefail: the CI scripts run under "set -o pipefail",
// where "cmd | head -1" fails with exit 141 whenever cmd writes after head
// has gone (SIGPIPE), which depends on timing: a CI run once died that way
// after 0 s. No such pipe may appear in them.
func TestCIScriptsSurvivePipefail(t *testing.T) {
	scripts, err := os.ReadDir("../../.ci")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range scripts {
		body, err := os.ReadFile("../../.ci/" + e.Name())
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(body), "pipefail") {
			continue
		}
		for i, line := range strings.Split(string(body), "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "#") {
				continue
			}
			if m := earlyExitReader.FindString(line); m != "" {
				t.Errorf(".ci/%s:%d pipes into %q under pipefail; capture the output first (see first_line in .ci/run): %s",
					e.Name(), i+1, m, strings.TrimSpace(line))
			}
		}
	}
}
