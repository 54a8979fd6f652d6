package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/server/registryapi"
	"github.com/beaconplane/beacon/store"
	etcdstore "github.com/beaconplane/beacon/store/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"golang.org/x/crypto/bcrypt"
	"golang.org/x/sync/errgroup"
)

// rootRegistry is a registry acting as etcd's root on s, closed when the
// test ends.
func rootRegistry(t testing.TB, ctx context.Context, s *Server) *registry.StoreRegistry {
	t.Helper()
	return registryAs(t, ctx, etcdstore.Config{Endpoints: s.Endpoints().ClientURLs, Username: "root", Password: rootPassword})
}

// registryAs is a registry over an etcd store opened with cfg, both closed
// when the test ends.
func registryAs(t testing.TB, ctx context.Context, cfg etcdstore.Config) *registry.StoreRegistry {
	t.Helper()
	st, err := etcdstore.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	r, err := registry.New(st, registry.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close(); _ = st.Close() })
	return r
}

// watchStreams counts the store watches of the server's own registry and
// of every user view's registry.
func watchStreams(t *testing.T, s *Server) (server, views int) {
	t.Helper()
	ws, ok := s.data.registry.(interface{ WatchStreams() int })
	if !ok {
		t.Fatalf("the server's registry (%T) does not count its watches", s.data.registry)
	}
	v := s.authn().views
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, uv := range v.views {
		views += uv.reg.WatchStreams()
	}
	return ws.WatchStreams(), views
}

// TestUserWatchesShareTheServerRegistry: with etcd authentication on, the
// SSE watches of two users who may read a namespace are served from the
// server's one registry — one store watch for both, none in their own
// views — while a user who may not read it is refused (403), as etcd
// would refuse that user's own watch. Revoking one user's permission ends
// that user's stream with a permission_denied error event (etcd checks a
// watch's permission only when it opens it; the server checks again when
// etcd's auth revision moves); the other user's stream carries on.
func TestUserWatchesShareTheServerRegistry(t *testing.T) {
	s := startServer(t, authConfig(t))
	s.authn().recheckEvery.Store(int64(time.Hour)) // only a moved auth revision makes it check again
	root := rootClient(t, s)
	grant(t, root, "alice", "alice-pw", "read /services/prod/")
	grant(t, root, "bob", "bob-pw", "read /services/prod/")
	grant(t, root, "carol", "carol-pw", "read /services/dev/")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	base := s.Endpoints().HTTP
	reg := rootRegistry(t, ctx, s)
	first := beacon.Instance{Namespace: "prod", Component: "api", Endpoint: "grpc", Address: "10.0.0.1:80"}
	if _, err := reg.Register(ctx, first); err != nil {
		t.Fatal(err)
	}
	before, _ := watchStreams(t, s)

	alice := openSSEAs(t, ctx, base, "prod", basic("alice", "alice-pw"))
	alice.waitFor(t, "alice's snapshot", func() bool { return alice.snapshots == 1 && len(alice.live) == 1 })
	bob := openSSEAs(t, ctx, base, "prod", basic("bob", "bob-pw"))
	bob.waitFor(t, "bob's snapshot", func() bool { return bob.snapshots == 1 && len(bob.live) == 1 })
	server, views := watchStreams(t, s)
	if server != before+1 || views != 0 {
		t.Fatalf("two users watching prod: the server's registry holds %d store watches (%d before), the users' views %d; want one more, and none",
			server, before, views)
	}

	r := as{t: t, base: base, auth: basic("carol", "carol-pw")}.stream(registryapi.WatchPath + "?namespace=prod")
	if r.code != http.StatusForbidden || !strings.Contains(r.body, "permission_denied") {
		t.Fatalf("carol (read on dev only) watching prod: %d %s, want 403 permission_denied", r.code, r.body)
	}

	if _, err := root.RoleRevokePermission(ctx, "alice-role", "/services/prod/", clientv3.GetPrefixRangeEnd("/services/prod/")); err != nil {
		t.Fatal(err)
	}
	alice.waitFor(t, "alice's stream to end", func() bool { return alice.failure != "" })
	var e registryapi.ErrorResponse
	if err := json.Unmarshal([]byte(alice.failure), &e); err != nil || e.Code != "permission_denied" {
		t.Fatalf("alice's error event %s (%v), want permission_denied", alice.failure, err)
	}
	second := first
	second.Address = "10.0.0.2:80"
	if _, err := reg.Register(ctx, second); err != nil {
		t.Fatal(err)
	}
	bob.waitFor(t, "bob to see the second instance", func() bool { return len(bob.live) == 2 })
}

// TestUserWatchEndsWithItsToken: a watch opened with a token that then
// expires ends with an unauthenticated error event once the server checks
// again, although etcd's auth revision did not move: etcd checks a watch's
// credentials only when it opens it.
func TestUserWatchEndsWithItsToken(t *testing.T) {
	cfg := authConfig(t)
	cfg.Security.AuthToken = "jwt"
	cfg.Security.AuthTokenTTL = 2 * time.Second // a hard expiry
	s := startServer(t, cfg)
	s.authn().recheckEvery.Store(int64(time.Second))
	root := rootClient(t, s)
	grant(t, root, "alice", "alice-pw", "read /services/prod/")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	base := s.Endpoints().HTTP
	r := as{t: t, base: base, auth: basic("alice", "alice-pw")}.do("POST", TokenPath, "")
	var tok TokenResponse
	if err := json.Unmarshal([]byte(r.body), &tok); err != nil || r.code != http.StatusOK {
		t.Fatalf("token: %d %s", r.code, r.body)
	}
	alice := openSSEAs(t, ctx, base, "prod", "Bearer "+tok.Token)
	alice.waitFor(t, "the stream to end", func() bool { return alice.failure != "" })
	var e registryapi.ErrorResponse
	if err := json.Unmarshal([]byte(alice.failure), &e); err != nil || e.Code != "unauthenticated" {
		t.Fatalf("error event %s (%v), want unauthenticated", alice.failure, err)
	}
	if alice.snapshots != 1 {
		t.Fatalf("%d snapshots before the end, want 1", alice.snapshots)
	}
}

// BenchmarkUserWatchMemory measures what users watching a namespace cost
// the server, with etcd authentication on: 10,000 instances in a
// namespace, then SSE watches of it by 10 users (each read to the end of
// its snapshot, then drained). first-heap-B is the server's live heap
// grown by the first user's watch (the namespace's state, once),
// heap-B/more-user what each of the other 9 added: served from the
// server's one registry, a cursor and a stream, not another copy.
func BenchmarkUserWatchMemory(b *testing.B) {
	const instances, users = 10_000, 10
	s := startServer(b, authConfig(b))
	root := rootClient(b, s)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	reg := rootRegistry(b, ctx, s)
	registerMany(b, ctx, reg, "bench", instances)
	for i := range users {
		grant(b, root, fmt.Sprintf("user%d", i), "pw", "read /services/bench/")
	}
	base := s.Endpoints().HTTP
	for b.Loop() {
		var streams []io.Closer
		open := func(i int) {
			streams = append(streams, snapshotRead(b, ctx, base, "bench", basic(fmt.Sprintf("user%d", i), "pw")))
		}
		h0 := liveHeap()
		open(0)
		h1 := liveHeap()
		for i := 1; i < users; i++ {
			open(i)
		}
		h2 := liveHeap()
		for _, c := range streams {
			_ = c.Close()
		}
		b.ReportMetric(float64(h1)-float64(h0), "first-heap-B")
		b.ReportMetric((float64(h2)-float64(h1))/(users-1), "heap-B/more-user")
	}
}

// registerMany registers n instances in namespace ns through reg, 64 at a
// time.
func registerMany(tb testing.TB, ctx context.Context, reg *registry.StoreRegistry, ns string, n int) {
	tb.Helper()
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(64)
	for i := range n {
		g.Go(func() error {
			_, err := reg.Register(ctx, beacon.Instance{Namespace: ns, Component: "api", Endpoint: "grpc",
				Address: fmt.Sprintf("10.%d.%d.%d:80", i>>16, i>>8&0xff, i&0xff)})
			return err
		})
	}
	if err := g.Wait(); err != nil {
		tb.Fatal(err)
	}
}

// liveHeap is the heap in use after a collection.
func liveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// snapshotRead opens an SSE watch of ns as auth, reads it to the end of
// its snapshot, and then drains it until closed, keeping none of it:
// openSSEAs keeps every instance, which a measurement of the process's
// heap would count as the server's.
func snapshotRead(tb testing.TB, ctx context.Context, base, ns, auth string) io.Closer {
	tb.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+registryapi.WatchPath+"?namespace="+ns, nil)
	if err != nil {
		tb.Fatal(err)
	}
	req.Header.Set("Authorization", auth)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		tb.Fatalf("watch as %s: %s", auth, resp.Status)
	}
	br := bufio.NewReaderSize(resp.Body, 64<<10)
	for inSnapshot := false; ; {
		line, err := br.ReadSlice('\n')
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			tb.Fatalf("reading the snapshot: %v", err)
		}
		switch {
		case bytes.Equal(line, []byte("event: snapshot\n")):
			inSnapshot = true
		case inSnapshot && bytes.Equal(line, []byte("\n")):
			go func() { _, _ = io.Copy(io.Discard, br) }()
			return resp.Body
		}
	}
}

// guardedSetup is an etcd with authentication on, where the user "svc"
// (the server's own user, in these tests) may read /services/prod/ only,
// and a registry acting as svc.
func guardedSetup(t *testing.T) (*registry.StoreRegistry, *userRegistry) {
	t.Helper()
	srv := etcdtest.Start(t, etcdtest.Options{User: "root", Password: "rootpw",
		Configure: func(c *embed.Config) { c.BcryptCost = uint(bcrypt.MinCost) }})
	root := srv.Client(t)
	grant(t, root, "svc", "svc-pw", "read /services/prod/")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reg := registryAs(t, ctx, etcdstore.Config{Endpoints: srv.Endpoints(), Username: "svc", Password: "svc-pw"})
	return reg, &userRegistry{self: func() string { return `"svc"` }}
}

// never is a recheck that checks nothing within a test.
func never() recheck {
	return recheck{atLeast: time.Hour, changes: newAuthRevisions(nil),
		may: func(context.Context) error { return nil }}
}

// TestGuardedWatchBlamesTheServersOwnUser: a watch the server's own
// registry may not make (its etcd user lacks read on the prefix, which
// the caller has) turns stale with an error that names the server's user
// and what to grant it — unavailable, not the caller's permission error,
// which would end the caller's stream and blame the caller.
func TestGuardedWatchBlamesTheServersOwnUser(t *testing.T) {
	reg, u := guardedSetup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w, err := reg.Watch(ctx, beacon.Query{Namespace: "dev"})
	if err != nil {
		t.Fatal(err)
	}
	g := newGuardedWatch(ctx, w, "/services/dev/", u.ownRefusal, never())
	defer g.Close()
	b, err := g.Next(ctx)
	if err != nil || b.Kind != registry.Stale {
		t.Fatalf("first batch %v, %v; want stale", b.Kind, err)
	}
	if !errors.Is(b.Err, store.ErrUnavailable) || errors.Is(b.Err, store.ErrPermissionDenied) ||
		!strings.Contains(b.Err.Error(), `own etcd user ("svc")`) || !strings.Contains(b.Err.Error(), "/services/dev/") {
		t.Fatalf("stale with %v; want unavailable, naming the server's user and the prefix", b.Err)
	}
}

// TestGuardedWatchEndsOnRefusal: once the recheck is refused, Next gives
// one stale batch with the refusal, then the refusal as its error, while
// the inner watch had nothing to say; Close is idempotent and ends the
// recheck.
func TestGuardedWatchEndsOnRefusal(t *testing.T) {
	reg, u := guardedSetup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w, err := reg.Watch(ctx, beacon.Query{Namespace: "prod"})
	if err != nil {
		t.Fatal(err)
	}
	refusal := fmt.Errorf("%w: revoked", store.ErrPermissionDenied)
	c := never()
	c.changes.rev = 1 // moved past the watch's 0
	refuse := make(chan struct{})
	c.may = func(ctx context.Context) error {
		select {
		case <-refuse:
			return refusal
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	g := newGuardedWatch(ctx, w, "/services/prod/", u.ownRefusal, c)
	if b, err := g.Next(ctx); err != nil || b.Kind != registry.Snapshot {
		t.Fatalf("first batch %v, %v; want the (empty) snapshot", b.Kind, err)
	}
	close(refuse)
	b, err := g.Next(ctx)
	if err != nil || b.Kind != registry.Stale || !errors.Is(b.Err, refusal) {
		t.Fatalf("after the refusal: %v (%v), %v; want stale with the refusal", b.Kind, b.Err, err)
	}
	if _, err := g.Next(ctx); !errors.Is(err, refusal) {
		t.Fatalf("then: %v, want the refusal", err)
	}
	for range 2 {
		if err := g.Close(); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-g.done:
	default:
		t.Fatal("Close returned with the recheck running")
	}
}

// TestAuthRevisionsTellListeners: the poller reads etcd's auth revision
// only while a watch listens, and closes the channel the watches wait on
// when, and only when, it moved.
func TestAuthRevisionsTellListeners(t *testing.T) {
	var etcdRev uint64 = 7
	reads := 0
	a := newAuthRevisions(func(context.Context) (uint64, error) { reads++; return etcdRev, nil })
	a.poll(t.Context())
	if reads != 0 {
		t.Fatalf("%d reads with no watch listening, want none", reads)
	}
	release := a.listen()
	_, moved := a.current()
	a.poll(t.Context())
	if rev, _ := a.current(); reads != 1 || rev != 7 {
		t.Fatalf("listened to: %d reads, revision %d; want 1 and 7", reads, rev)
	}
	select {
	case <-moved:
	default:
		t.Fatal("the revision moved from 0 to 7 and nobody was told")
	}
	_, moved = a.current()
	a.poll(t.Context())
	select {
	case <-moved:
		t.Fatal("told of a move while the revision stayed 7")
	default:
	}
	etcdRev = 8
	a.poll(t.Context())
	select {
	case <-moved:
	default:
		t.Fatal("the revision moved from 7 to 8 and nobody was told")
	}
	release()
	release() // idempotent
	a.poll(t.Context())
	if reads != 3 {
		t.Fatalf("%d reads after the last watch went, want 3", reads)
	}
}
