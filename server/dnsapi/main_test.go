package dnsapi

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/testkit/natstest"
	"github.com/beaconplane/beacon/internal/testkit/testpeer"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store/etcd"
	"go.uber.org/goleak"
)

// The SIGKILL test runs a registrant in a child process: the test binary,
// re-executed with childEnv set to the etcd endpoint, registers one
// instance with a 2 s lease and keeps it alive until killed (or until its
// stdin closes, so that it never outlives the test).
const childEnv = "BEACON_DNS_TEST_CHILD_ETCD"

func TestMain(m *testing.M) {
	if ep := os.Getenv(childEnv); ep != "" {
		os.Exit(runChild(ep))
	}
	code := m.Run()
	if code == 0 {
		// Every goroutine of a closed Server (watch loop, listeners,
		// per-packet handlers) has ended; etcd and NATS leave a few of
		// their own for a moment.
		opts := append(natstest.LeakOptions(),
			goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
			goleak.IgnoreAnyFunction("github.com/golang/glog.(*fileSink).flushDaemon"),
			goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
			goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"))
		if err := goleak.Find(opts...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// childTTL is the lease TTL of the child's registration.
const childTTL = 2 * time.Second

func runChild(endpoint string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := etcd.Open(ctx, etcd.Config{Endpoints: []string{endpoint}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	r, err := registry.New(st, registry.Config{LeaseTTL: childTTL})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	reg, err := r.Register(ctx, beacon.Instance{Namespace: "prod", Component: "worker", Endpoint: "gen", Address: "10.9.0.1:7000"})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	fmt.Println("registered", reg.Instance().ID)
	_, _ = io.Copy(io.Discard, os.Stdin)
	_ = r.Close()
	_ = st.Close()
	return 0
}

// startChild starts a registrant against endpoint and returns its process
// and the ID it registered.
func startChild(t *testing.T, endpoint string) (*exec.Cmd, string) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := testpeer.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+endpoint)
	cmd.Stderr = os.Stderr
	stdin, stdout := testpeer.StartPiped(t, cmd)
	t.Cleanup(func() {
		_ = stdin.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	id, ok := strings.CutPrefix(strings.TrimSpace(line), "registered ")
	if err != nil || !ok {
		t.Fatalf("child: %q, %v", line, err)
	}
	return cmd, id
}
