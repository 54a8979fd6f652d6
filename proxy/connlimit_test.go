package proxy

import (
	"bufio"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/beaconplane/beacon/internal/syncbuf"
	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// TestConnectionFloodDoesNotTakeTheProxy: a flood of idle connections
// (opened and left, from one address and from another) cannot take the
// proxy's file descriptors, nor lock out the clients that make calls: at
// MaxConnsPerClient and at MaxConns a new connection takes the place of
// one that has carried no call, never of one with a watch or a gateway
// stream open. Before, nothing bounded them: a thousand idle connections
// took every file descriptor of a proxy run with the common limit of
// 1,024, and its listener closed for good.
func TestConnectionFloodDoesNotTakeTheProxy(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t, etcdtest.Options{})
	var logs syncbuf.Buffer
	p := startProxy(t, Config{Endpoints: srv.Endpoints(), MaxConns: 8, MaxConnsPerClient: 4, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	ctx := ctxT(t)

	// In use from 127.0.0.2: a watch stream and a gateway watch stream.
	ws, err := pb.NewWatchClient(dialFrom(t, p, "127.0.0.2")).Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := ws.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: &pb.WatchCreateRequest{Key: []byte("/flood")}}}); err != nil {
		t.Fatal(err)
	}
	if r, err := ws.Recv(); err != nil || !r.Created {
		t.Fatalf("watch: %+v %v", r, err)
	}
	gw := gatewayLines(t, p, "127.0.0.2", "/v3/watch", `{"create_request":{"key":"L2Zsb29k"}}`)
	if line := <-gw; !strings.Contains(line, `"created":true`) {
		t.Fatalf("gateway watch: %s", line)
	}

	// The flood: more idle connections than either bound, from two
	// addresses.
	for _, src := range []string{"127.0.0.2", "127.0.0.3"} {
		for range 12 {
			c, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}).DialContext(ctx, "tcp", p.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Close() })
		}
	}

	// Calls from both addresses, and a third, still get through.
	for _, src := range []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"} {
		if _, err := pb.NewKVClient(dialFrom(t, p, src)).Put(ctx, &pb.PutRequest{Key: []byte("/flood"), Value: []byte(src)}); err != nil {
			t.Fatalf("a put from %s past the flood: %v", src, err)
		}
	}
	// The flood's connections were accepted before those of the puts, and
	// made room for each other.
	if !strings.Contains(logs.String(), "oldest idle connection") {
		t.Fatalf("no connection of the flood was closed to make room; the proxy logged:\n%s", logs.String())
	}
	// The streams in use kept their connections: each sees the puts.
	for range 3 {
		if r, err := ws.Recv(); err != nil || len(r.Events) == 0 {
			t.Fatalf("the watch stream after the flood: %+v %v", r, err)
		}
		if line := <-gw; !strings.Contains(line, `"events"`) {
			t.Fatalf("the gateway watch after the flood: %q", line)
		}
	}
}

// gatewayLines opens a JSON gateway stream from the loopback source
// address src and sends each line it reads (the status first, if not
// 200); the channel closes when the stream ends.
func gatewayLines(t *testing.T, p *Proxy, src, path, body string) <-chan string {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}).DialContext}}
	t.Cleanup(c.CloseIdleConnections)
	req, _ := http.NewRequestWithContext(ctxT(t), http.MethodPost, "http://"+p.Addr().String()+path, strings.NewReader(body))
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(lines)
		if resp.StatusCode != http.StatusOK {
			lines <- resp.Status
		}
		r := bufio.NewReader(resp.Body)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			lines <- line
		}
	}()
	t.Cleanup(func() {
		_ = resp.Body.Close()
		<-done
	})
	return lines
}
