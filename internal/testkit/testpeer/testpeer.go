// Package testpeer finds third-party programs that interop tests run as
// real peers: Debian packages (Binary; for example Debian's etcd 3.4 for the
// v2 discovery protocol), peers built from this module's own dependencies
// (GoBuild; the real etcdctl 3.7.3), and heavy peers built once per CI run
// from other Go modules by .ci/build-peers into a cache directory (Built;
// kube-apiserver, CoreDNS, ...).
//
// Locally a missing peer skips the test with instructions. In CI, where
// BEACON_REQUIRE_PEERS=1 is set by .ci/run after it installs every peer, a
// missing peer fails the test instead, so nothing is skipped silently.
//
// Every test starts its processes (these peers, the beacon binary, the test
// binary in another role) with Command or CommandContext, which make them
// die with the test process however it ends.
package testpeer

import (
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// RequireEnv is the variable that turns a missing peer into a failure.
const RequireEnv = "BEACON_REQUIRE_PEERS"

// Binary returns the path of the first candidate found (an absolute path or
// a name looked up in PATH). If none exists the test is skipped, or failed
// when RequireEnv is set; install says how to get it (e.g. "apt-get install
// etcd-server").
func Binary(tb testing.TB, install string, candidates ...string) string {
	tb.Helper()
	for _, c := range candidates {
		if p, err := exec.LookPath(c); err == nil {
			return p
		}
	}
	Missing(tb, "peer program not found (looked for "+joinQuoted(candidates)+"); install it with: "+install)
	return ""
}

// Missing ends a test that cannot run because a peer, a privilege or a
// tool it needs is missing: it skips it with why (say what is missing and
// how to get it), or, when RequireEnv is set (CI, where everything is
// there), fails it. A test that cannot run must never pass having run
// nothing.
func Missing(tb testing.TB, why string) {
	tb.Helper()
	if os.Getenv(RequireEnv) != "" {
		tb.Fatal(why + " (" + RequireEnv + " is set: everything the tests need must be there)")
		return
	}
	tb.Skip(why)
}

func joinQuoted(s []string) string {
	out := ""
	for i, c := range s {
		if i > 0 {
			out += ", "
		}
		out += "\"" + c + "\""
	}
	return out
}

// PeersDirEnv names the directory where .ci/build-peers puts the peers it
// builds from Go modules outside this one (kube-apiserver, CoreDNS, ...),
// under bin/. Its default is DefaultPeersDir.
const PeersDirEnv = "BEACON_PEERS_DIR"

// DefaultPeersDir is where .ci/build-peers builds when BEACON_PEERS_DIR is
// unset: beacon-peers under the user's cache directory.
func DefaultPeersDir() string {
	if d := os.Getenv(PeersDirEnv); d != "" {
		return d
	}
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "beacon-peers")
	}
	return filepath.Join(os.TempDir(), "beacon-peers")
}

// Built returns the path of a peer that .ci/build-peers builds from Go
// modules (name is its binary's name, e.g. "kube-apiserver"): the one in
// DefaultPeersDir()/bin, else one in PATH. If there is none, the test is
// skipped with the command that builds it, or failed when RequireEnv is
// set.
func Built(tb testing.TB, name string) string {
	tb.Helper()
	p := filepath.Join(DefaultPeersDir(), "bin", name)
	if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
		return p
	}
	return Binary(tb, "bash .ci/build-peers "+name+" (builds it into "+filepath.Dir(p)+")", name)
}

// buildDirPrefix starts the name of the temporary directory a test process
// builds its peers in; the process's ID follows.
const buildDirPrefix = "beacon-peer-bin-"

// sweepBuildDirs removes the build directories of test processes that
// have ended. A test process cannot remove its own (no hook runs at its
// exit), and each holds a few binaries of tens of megabytes: one machine
// had kept 18 GB of them in /tmp.
func sweepBuildDirs() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), buildDirPrefix+"*"))
	for _, d := range dirs {
		pid, _, ok := strings.Cut(strings.TrimPrefix(filepath.Base(d), buildDirPrefix), "-")
		if n, err := strconv.Atoi(pid); ok && err == nil && n != os.Getpid() && !alive(n) {
			_ = os.RemoveAll(d)
		}
	}
}

var (
	goBuildMu   sync.Mutex
	goBuildDir  string
	goBuildDone = map[string]string{}
)

// GoBuild builds a main package of this module (for example
// "github.com/beaconplane/beacon/internal/etcdctl", the real etcdctl 3.7.3)
// once per test process and returns the binary's path. The Go build cache
// makes it cheap after the first time. It fails the test if the build
// fails.
func GoBuild(tb testing.TB, pkg string) string {
	tb.Helper()
	return GoBuildWith(tb, path.Base(pkg), pkg)
}

// GoBuildWith builds pkg as GoBuild does, with extra `go build` flags (build
// tags, an -overlay), into a binary called name: builds of one package
// with different flags need different names. Each name is built once per
// test process.
func GoBuildWith(tb testing.TB, name, pkg string, flags ...string) string {
	tb.Helper()
	goBuildMu.Lock()
	defer goBuildMu.Unlock()
	if bin, ok := goBuildDone[name]; ok {
		return bin
	}
	if goBuildDir == "" {
		sweepBuildDirs()
		d, err := os.MkdirTemp("", buildDirPrefix+strconv.Itoa(os.Getpid())+"-")
		if err != nil {
			tb.Fatalf("testpeer: %v", err)
		}
		goBuildDir = d // binaries are reused within the process; the next process's sweep removes it
	}
	bin := filepath.Join(goBuildDir, name)
	args := append(append([]string{"build"}, flags...), "-o", bin, pkg)
	out, err := Command("go", args...).CombinedOutput()
	if err != nil {
		tb.Fatalf("testpeer: go %v: %v\n%s", args, err, out)
	}
	goBuildDone[name] = bin
	return bin
}

var pythonGRPC = sync.OnceValue(func() string {
	for _, p := range []string{"/usr/bin/python3", "python3"} {
		if path, err := exec.LookPath(p); err == nil && Command(path, "-c", "import grpc").Run() == nil {
			return path
		}
	}
	return ""
})

// PythonGRPC returns a python3 whose grpc module is gRPC C-core's
// (Debian's python3-grpcio; the python3 first in PATH may lack it).
func PythonGRPC(tb testing.TB) string {
	tb.Helper()
	p := pythonGRPC()
	if p == "" {
		Missing(tb, "no python3 with the grpc module (gRPC C-core): install it with apt-get install python3-grpcio")
	}
	return p
}

// Node returns the node binary, once the npm packages of the project in
// dir (a directory with a package-lock.json) are installed.
func Node(tb testing.TB, dir string) string {
	tb.Helper()
	node := Binary(tb, "apt-get install nodejs npm", "node", "nodejs")
	if _, err := os.Stat(filepath.Join(dir, "node_modules")); err != nil {
		Missing(tb, "the npm packages of "+dir+" are not installed: run npm ci --prefix "+dir)
	}
	return node
}

// StartPiped starts cmd with its stdin and stdout piped to the test, and
// returns them; the test fails if it cannot. (Who stops the process stays
// the caller's choice: its cleanup closes stdin, signals or waits.)
func StartPiped(tb testing.TB, cmd *exec.Cmd) (stdin io.WriteCloser, stdout io.ReadCloser) {
	tb.Helper()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stdout, err = cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	return stdin, stdout
}
