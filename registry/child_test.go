package registry_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/testkit/testpeer"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/etcd"
)

// The SIGKILL drill runs a registrant in a child process: the test binary,
// re-executed with childEnv set, registers instances and keeps them alive
// until it is killed (or its stdin closes, so that it never outlives the
// test).
const (
	childEnv          = "BEACON_REGISTRY_TEST_CHILD"
	childEndpointsEnv = "BEACON_REGISTRY_TEST_CHILD_ENDPOINTS"
	childNamespaceEnv = "BEACON_REGISTRY_TEST_CHILD_NS"
	childCountEnv     = "BEACON_REGISTRY_TEST_CHILD_N"
	childTTLEnv       = "BEACON_REGISTRY_TEST_CHILD_TTL"
)

// runChild is the child's main: it prints one "id <ref>" per instance,
// "lease <id> <ttl>", then "ready".
func runChild() int {
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	n, err := strconv.Atoi(os.Getenv(childCountEnv))
	if err != nil {
		return fail(err)
	}
	ttl, err := time.ParseDuration(os.Getenv(childTTLEnv))
	if err != nil {
		return fail(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := etcd.Open(ctx, etcd.Config{Endpoints: strings.Split(os.Getenv(childEndpointsEnv), ",")})
	if err != nil {
		return fail(err)
	}
	r, err := registry.New(st, registry.Config{LeaseTTL: ttl})
	if err != nil {
		return fail(err)
	}
	ns := os.Getenv(childNamespaceEnv)
	for i := range n {
		reg, err := r.Register(ctx, beacon.Instance{Namespace: ns, Component: "worker", Endpoint: "generate",
			Address: fmt.Sprintf("10.7.0.%d:9000", i+1), Transport: "tcp"})
		if err != nil {
			return fail(err)
		}
		fmt.Println("id", reg.Instance().Ref())
	}
	c := <-r.States()
	fmt.Println("lease", c.Lease, r.LeaseTTL())
	fmt.Println("ready")
	// Keep the lease alive until killed, or until the parent goes away.
	_, _ = io.Copy(io.Discard, os.Stdin)
	_ = r.Close()
	_ = st.Close()
	return 0
}

// child is a registrant process started by startChild.
type child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	ids   []string
	lease store.LeaseID
}

// startChild starts a child registering n instances in ns and waits until
// it is ready.
func startChild(t *testing.T, endpoints []string, ns string, n int, ttl time.Duration) *child {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := testpeer.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(),
		childEnv+"=1",
		childEndpointsEnv+"="+strings.Join(endpoints, ","),
		childNamespaceEnv+"="+ns,
		childCountEnv+"="+strconv.Itoa(n),
		childTTLEnv+"="+ttl.String(),
	)
	cmd.Stderr = os.Stderr
	stdin, stdout := testpeer.StartPiped(t, cmd)
	c := &child{cmd: cmd, stdin: stdin}
	t.Cleanup(func() {
		_ = stdin.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatal("child exited before it was ready")
			}
			if id, ok := strings.CutPrefix(line, "id "); ok {
				c.ids = append(c.ids, id)
			}
			if rest, ok := strings.CutPrefix(line, "lease "); ok {
				id, _, _ := strings.Cut(rest, " ")
				n, err := strconv.ParseInt(id, 10, 64)
				if err != nil {
					t.Fatalf("child printed %q", line)
				}
				c.lease = store.LeaseID(n)
			}
			if line == "ready" {
				go func() { // drain the rest
					for range lines {
					}
				}()
				return c
			}
		case <-deadline:
			t.Fatal("child not ready within 30 s")
		}
	}
}
