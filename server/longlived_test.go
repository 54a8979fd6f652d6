package server

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/naming"
	"github.com/beaconplane/beacon/naming/namingtest"
	"github.com/beaconplane/beacon/proxy"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/server/registryapi"
	"github.com/beaconplane/beacon/store"
	etcdstore "github.com/beaconplane/beacon/store/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// longLivedFor is how long the first phase runs per token kind: ~10
// expiries of a 2 s token.
const longLivedFor = 20 * time.Second

// TestLongLivedUnderAuth runs every long-lived client of Beacon against an
// etcd whose tokens expire every 2 s (JWT, hard expiry): a registry
// session (keep-alives, updates, verification), a registry watch, the gRPC
// resolver over it, an etcd client through `beacon proxy` (a watch and a
// lease keep-alive stream), and an SSE watch of the HTTP API. Each keeps
// working across the expiries. Then the users' credentials change: a
// changed password puts the session in state lost with an error that says
// so, a revoked role ends the watches with a permission error (the SSE
// stream with an error event), and the proxy's client gets an
// authentication error — nothing stops silently.
func TestLongLivedUnderAuth(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for about a minute")
	}
	// JWT expires 2 s after issue, whatever the use; a simple token 2 s
	// after its last use.
	for _, kind := range []string{"jwt", "simple"} {
		t.Run(kind, func(t *testing.T) { longLived(t, kind) })
	}
}

func longLived(t *testing.T, authToken string) {
	cfg := authConfig(t)
	cfg.Security.AuthToken = authToken
	cfg.Security.AuthTokenTTL = 2 * time.Second
	s := startServer(t, cfg)
	root := rootClient(t, s)
	grant(t, root, "worker", "worker-pw", "readwrite /services/prod/")
	grant(t, root, "watcher", "watcher-pw", "read /services/prod/")
	grant(t, root, "app", "app-pw", "readwrite /app/")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	endpoints := s.Endpoints().ClientURLs

	openRegistry := func(user, pw string) *registry.StoreRegistry {
		st, err := etcdstore.Open(ctx, etcdstore.Config{Endpoints: endpoints, Username: user, Password: pw})
		if err != nil {
			t.Fatal(err)
		}
		r, err := registry.New(st, registry.Config{LeaseTTL: 3 * time.Second, VerifyInterval: 4 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Close(); _ = st.Close() })
		return r
	}
	// The session.
	worker := openRegistry("worker", "worker-pw")
	b1, b2 := namingtest.Start(t, "b1"), namingtest.Start(t, "b2")
	backends := []*namingtest.Backend{b1, b2}
	reg, err := worker.Register(ctx, beacon.Instance{Namespace: "prod", Component: "api", Endpoint: "grpc", Address: b1.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	// A watch and the resolver over it.
	watcher := openRegistry("watcher", "watcher-pw")
	w, err := watcher.Watch(ctx, beacon.Query{Namespace: "prod"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	builder, err := naming.NewBuilder(watcher)
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient("beacon:///prod/api/grpc", builder.DialOption(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	// An etcd client through the proxy: a watch and a keep-alive stream.
	p, err := proxy.New(proxy.Config{Endpoints: endpoints})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	proxyDone := make(chan error, 1)
	go func() { proxyDone <- p.Serve(context.Background(), ln) }()
	defer func() { _ = p.Close(); <-proxyDone }()
	<-p.Ready()
	app, err := clientv3.New(clientv3.Config{Endpoints: []string{p.Addr().String()}, Username: "app", Password: "app-pw", DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	appWatch := app.Watch(ctx, "/app/", clientv3.WithPrefix())
	lease, err := app.Grant(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	kach, err := app.KeepAlive(ctx, lease.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := app.Put(ctx, "/app/leased", "x", clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	// An SSE stream of the HTTP API as the watcher.
	req, _ := http.NewRequestWithContext(ctx, "GET", s.Endpoints().HTTP+registryapi.WatchPath+"?namespace=prod", nil)
	req.Header.Set("Authorization", basic("watcher", "watcher-pw"))
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("SSE watch as watcher: %v %v", resp, err)
	}
	defer resp.Body.Close()
	sse := make(chan string, 64) // "event data"
	go func() {
		defer close(sse)
		sc := bufio.NewScanner(resp.Body)
		var ev string
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "event: "):
				ev = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				sse <- ev + " " + strings.TrimPrefix(line, "data: ")
			}
		}
	}()

	waitFor := func(what string, ok func() bool, next func(context.Context) error) {
		t.Helper()
		wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
		defer wcancel()
		for !ok() {
			if err := next(wctx); err != nil {
				t.Fatalf("waiting for %s: %v", what, err)
			}
		}
	}
	var last registry.Batch
	nextBatch := func(c context.Context) error { b, err := w.Next(c); last = b; return err }
	var sseLast string
	nextSSE := func(c context.Context) error {
		select {
		case e, ok := <-sse:
			if !ok {
				return errors.New("SSE stream ended")
			}
			sseLast = e
			return nil
		case <-c.Done():
			return c.Err()
		}
	}
	start := time.Now()
	pace := time.NewTicker(time.Second) // spread the rounds over the expiries
	defer pace.Stop()
	for round := 1; time.Since(start) < longLivedFor; round++ {
		<-pace.C
		r := strconv.Itoa(round)
		target := backends[round%2]
		if err := reg.Update(ctx, func(in *beacon.Instance) {
			in.Address = target.Addr()
			in.Metadata = map[string]string{"round": r}
		}); err != nil {
			t.Fatalf("round %d: session update: %v", round, err)
		}
		waitFor("the watch to see round "+r, func() bool {
			for _, e := range last.Events {
				if e.Instance.Metadata["round"] == r {
					return true
				}
			}
			return false
		}, nextBatch)
		waitFor("the SSE stream to see round "+r, func() bool { return strings.Contains(sseLast, `"round":"`+r+`"`) }, nextSSE)
		if err := namingtest.SettleOn(ctx, cc, 3, target.Name()); err != nil {
			t.Fatalf("round %d: the resolver did not move to %s: %v", round, target.Name(), err)
		}
		if _, err := app.Put(ctx, "/app/k", r); err != nil {
			t.Fatalf("round %d: put through the proxy: %v", round, err)
		}
		seen := false
		for !seen {
			select {
			case wr := <-appWatch:
				if err := wr.Err(); err != nil {
					t.Fatalf("round %d: watch through the proxy: %v", round, err)
				}
				for _, e := range wr.Events {
					seen = seen || (string(e.Kv.Key) == "/app/k" && string(e.Kv.Value) == r)
				}
			case <-time.After(20 * time.Second):
				t.Fatalf("round %d: the watch through the proxy missed the put", round)
			}
		}
		select {
		case ka, ok := <-kach:
			if !ok || ka == nil {
				ttl, err := app.TimeToLive(ctx, lease.ID)
				t.Fatalf("round %d (%v): the keep-alive stream through the proxy ended; lease %+v %v", round, time.Since(start), ttl, err)
			}
		default:
		}
		if st := worker.State(); st != registry.StateActive {
			t.Fatalf("round %d: session state %v, want active", round, st)
		}
	}
	for _, c := range drainStates(worker) {
		if c.State != registry.StateActive {
			t.Fatalf("the session left active during token expiries: %+v", c)
		}
	}
	if got, err := app.Get(ctx, "/app/leased"); err != nil || len(got.Kvs) != 1 {
		t.Fatalf("the key on the lease kept alive through the proxy: %v %v", got, err)
	}

	// Credentials change.
	if _, err := root.UserChangePassword(ctx, "worker", "rotated"); err != nil {
		t.Fatal(err)
	}
	if _, err := root.RoleRevokePermission(ctx, "watcher-role", "/services/prod/", clientv3.GetPrefixRangeEnd("/services/prod/")); err != nil {
		t.Fatal(err)
	}
	if _, err := root.UserChangePassword(ctx, "app", "rotated"); err != nil {
		t.Fatal(err)
	}
	// The session: lost, saying why.
	lost := waitState(t, worker, 30*time.Second, registry.StateLost)
	if lost.Err == nil || !errors.Is(lost.Err, store.ErrUnauthenticated) || !strings.Contains(lost.Err.Error(), "authentication failed") {
		t.Fatalf("session lost with %v, want the authentication failure", lost.Err)
	}
	// The watch: a stale batch with the permission error.
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	for {
		b, err := w.Next(wctx)
		if err != nil {
			t.Fatalf("watch after the revocation: %v", err)
		}
		if b.Kind == registry.Stale {
			if !errors.Is(b.Err, store.ErrPermissionDenied) {
				t.Fatalf("stale batch after the revocation: %v, want permission denied", b.Err)
			}
			break
		}
	}
	// The SSE stream: an error event, then the end.
	for {
		if err := nextSSE(wctx); err != nil {
			t.Fatalf("SSE after the revocation: %v (last %q)", err, sseLast)
		}
		if strings.HasPrefix(sseLast, "error ") {
			if !strings.Contains(sseLast, "permission_denied") {
				t.Fatalf("SSE error event %q", sseLast)
			}
			break
		}
	}
	// The proxy's client: an authentication error on its next call.
	if _, err := app.Put(ctx, "/app/k", "after"); err == nil || !strings.Contains(err.Error(), "authentication failed") {
		t.Fatalf("put through the proxy after the password change: %v", err)
	}
}

// drainStates returns the state changes r has queued.
func drainStates(r *registry.StoreRegistry) []registry.StateChange {
	var out []registry.StateChange
	for {
		select {
		case c := <-r.States():
			out = append(out, c)
		default:
			return out
		}
	}
}

// waitState reads r's state changes until one in want arrives.
func waitState(t *testing.T, r *registry.StoreRegistry, within time.Duration, want registry.State) registry.StateChange {
	t.Helper()
	deadline := time.After(within)
	for {
		select {
		case c, ok := <-r.States():
			if !ok {
				t.Fatalf("States closed while waiting for %v", want)
			}
			if c.State == want {
				return c
			}
		case <-deadline:
			t.Fatalf("no %v state within %v (now %v)", want, within, r.State())
		}
	}
}
