package xdsapi

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/syncbuf"
	"github.com/beaconplane/beacon/internal/testkit/testpeer"
	"github.com/beaconplane/beacon/naming/namingtest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/xds"
)

// A client is one proxyless gRPC client, of one of the three xDS client
// implementations the tests run: grpc-go in this process, Node's
// @grpc/grpc-js-xds and gRPC C-core (Debian's python3-grpcio) as child
// processes. Call makes one RPC to its target and returns the name of the
// namingtest backend that served it.
type client interface {
	Call(ctx context.Context) (backend string, err error)
}

// clientKind starts a client of one implementation for target, its
// bootstrap pointing at the xDS server at addr.
type clientKind struct {
	name  string
	start func(t testing.TB, addr string, targets ...string) multiClient
}

// clientKinds are the three implementations every scenario runs against.
var clientKinds = []clientKind{
	{"grpc-go", startGoClient},
	{"node", startNodeClient},
	{"c-core", startPythonClient},
}

// forEachClient runs f once per client implementation, as subtests.
func forEachClient(t *testing.T, f func(t *testing.T, k clientKind)) {
	for _, k := range clientKinds {
		t.Run(k.name, func(t *testing.T) { f(t, k) })
	}
}

// A multiClient is a client process with channels to several targets, all
// on its one xDS client (one ADS stream): Call uses the first.
type multiClient interface {
	client
	CallOn(ctx context.Context, i int) (string, error)
}

// goCaller is grpc-go's client: channels that share one xDS client.
type goCaller struct{ ccs []*grpc.ClientConn }

func (g goCaller) Call(ctx context.Context) (string, error) { return g.CallOn(ctx, 0) }

func (g goCaller) CallOn(ctx context.Context, i int) (string, error) {
	return namingtest.Call(ctx, g.ccs[i])
}

func startGoClient(t testing.TB, addr string, targets ...string) multiClient {
	b, err := xds.NewXDSResolverWithConfigForTesting(bootstrap(addr, "go-client"))
	if err != nil {
		t.Fatal(err)
	}
	var g goCaller
	for _, target := range targets {
		cc, err := grpc.NewClient(target, grpc.WithResolvers(b), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cc.Close() })
		g.ccs = append(g.ccs, cc)
	}
	return g
}

// procClient is a client in a child process that speaks the line protocol
// of testdata/node/client.js and testdata/python/client.py.
type procClient struct {
	mu     sync.Mutex
	in     io.WriteCloser
	out    *bufio.Scanner
	stderr *syncbuf.Buffer
}

// callTimeout is the deadline of one RPC of a child client.
const callTimeout = 5 * time.Second

// errRPC is an RPC that failed in a child client: Code is the gRPC code's
// name.
type errRPC struct{ Code, Details string }

func (e *errRPC) Error() string { return e.Code + ": " + e.Details }

// Call asks the child for one RPC on its first target.
func (p *procClient) Call(ctx context.Context) (string, error) { return p.CallOn(ctx, 0) }

// CallOn asks the child for one RPC on its i-th target. A child that does
// not answer within the call's deadline and a few seconds more fails the
// test.
func (p *procClient) CallOn(ctx context.Context, i int) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, err := fmt.Fprintf(p.in, "call %d %d\n", callTimeout.Milliseconds(), i); err != nil {
		return "", fmt.Errorf("client process: %w", err)
	}
	line := make(chan string, 1)
	go func() {
		if p.out.Scan() {
			line <- p.out.Text()
		}
		close(line)
	}()
	select {
	case l, ok := <-line:
		if !ok {
			return "", fmt.Errorf("client process ended: %v\n%s", p.out.Err(), p.stderr)
		}
		if b, ok := strings.CutPrefix(l, "ok "); ok {
			return b, nil
		}
		if rest, ok := strings.CutPrefix(l, "err "); ok {
			code, details, _ := strings.Cut(rest, " ")
			return "", &errRPC{Code: code, Details: details}
		}
		return "", fmt.Errorf("client process said %q", l)
	case <-ctx.Done():
		// The reader goroutine ends when the child is killed at cleanup.
		return "", fmt.Errorf("client process did not answer: %w\n%s", ctx.Err(), p.stderr)
	}
}

// startProc starts a child client and stops it with the test. env is added
// to the child's environment.
func startProc(t testing.TB, bootstrapDoc []byte, env []string, name string, args ...string) *procClient {
	t.Helper()
	bs := filepath.Join(t.TempDir(), "bootstrap.json")
	if err := os.WriteFile(bs, bootstrapDoc, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := testpeer.Command(name, args...)
	cmd.Env = append(append(os.Environ(), "GRPC_XDS_BOOTSTRAP="+bs), env...)
	stderr := &syncbuf.Buffer{}
	cmd.Stderr = stderr
	in, out := testpeer.StartPiped(t, cmd)
	t.Cleanup(func() {
		_ = in.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("%s stderr:\n%s", name, stderr)
		}
	})
	return &procClient{in: in, out: bufio.NewScanner(out), stderr: stderr}
}

// nodeDir holds the Node client and its npm packages.
var nodeDir = filepath.Join("testdata", "node")

func startNodeClient(t testing.TB, addr string, targets ...string) multiClient {
	t.Helper()
	node := testpeer.Node(t, nodeDir)
	return startProc(t, bootstrap(addr, "node-client"), nil, node, append([]string{filepath.Join(nodeDir, "client.js")}, targets...)...)
}

func startPythonClient(t testing.TB, addr string, targets ...string) multiClient {
	t.Helper()
	return startProc(t, bootstrap(addr, "python-client"), nil, testpeer.PythonGRPC(t), append([]string{filepath.Join("testdata", "python", "client.py")}, targets...)...)
}

// reachAll calls c until every backend in names has served a call, or the
// test's deadline.
func reachAll(t testing.TB, c client, names ...string) {
	t.Helper()
	ctx := testContext(t)
	left := map[string]bool{}
	for _, n := range names {
		left[n] = true
	}
	var lastErr error
	for len(left) > 0 {
		b, err := c.Call(ctx)
		if ctx.Err() != nil {
			t.Fatalf("backends %v never served a call (last error: %v)", keys(left), lastErr)
		}
		if err != nil {
			lastErr = err
			continue
		}
		delete(left, b)
	}
}

// settleOn calls c until n calls in a row were served by backends in names
// only, then n more, which must be too; it fails the test otherwise.
func settleOn(t testing.TB, c client, n int, names ...string) {
	t.Helper()
	ctx := testContext(t)
	ok := map[string]bool{}
	for _, name := range names {
		ok[name] = true
	}
	run := 0
	var last string
	var lastErr error
	for run < n {
		b, err := c.Call(ctx)
		if ctx.Err() != nil {
			t.Fatalf("calls never settled on %v (last served by %q, last error %v)", names, last, lastErr)
		}
		if err != nil || !ok[b] {
			run, last, lastErr = 0, b, err
			continue
		}
		run++
	}
	for i := range n {
		b, err := c.Call(ctx)
		if err != nil || !ok[b] {
			t.Fatalf("call %d after settling on %v: served by %q, error %v", i, names, b, err)
		}
	}
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
