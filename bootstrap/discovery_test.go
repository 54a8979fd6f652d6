package bootstrap_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/beaconplane/beacon/bootstrap"
	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func TestJoinMembersAgreeAndLateMemberIsRefused(t *testing.T) {
	srv := registryServer(t)
	tok, cli := createToken(t, 3)
	cfg := config(srv, tok)
	ctx := testCtx(t, 20*time.Second)

	names := []string{"m1", "m2", "m3"}
	results := make([]<-chan joinResult, len(names))
	for i, n := range names {
		results[i] = joinAsync(t, ctx, cfg, n, peerURL(i))
	}
	var first bootstrap.Cluster
	for i := range names {
		r := await(t, results[i], "join "+names[i])
		if r.err != nil {
			t.Fatalf("join %s: %v", names[i], r.err)
		}
		if i == 0 {
			first = r.cluster
			continue
		}
		if r.cluster.InitialCluster != first.InitialCluster {
			t.Fatalf("members disagree: %q vs %q", r.cluster.InitialCluster, first.InitialCluster)
		}
	}
	if first.Token != tok || first.Size != 3 || len(first.Members) != 3 {
		t.Fatalf("cluster %+v", first)
	}
	// The initial cluster lists the members in registration order, and
	// each key is the ID etcd will compute.
	var parts []string
	for i, m := range first.Members {
		if i > 0 && m.CreateRevision <= first.Members[i-1].CreateRevision {
			t.Fatalf("members out of order: %+v", first.Members)
		}
		id, err := bootstrap.MemberID(m.PeerURLs, tok)
		if err != nil || m.Key != bootstrap.MemberKey(tok, id) || m.ID != bootstrap.FormatID(id) {
			t.Fatalf("member %s registered under %s, want ID %x (%v)", m.Name, m.Key, id, err)
		}
		parts = append(parts, m.Value)
	}
	if first.InitialCluster != strings.Join(parts, ",") {
		t.Fatalf("initial cluster %q", first.InitialCluster)
	}

	// A fourth member is refused before it registers.
	_, err := bootstrap.Join(ctx, cfg, "m4", []string{peerURL(4)})
	if !errors.Is(err, bootstrap.ErrFullCluster) || !strings.Contains(err.Error(), "discovery: cluster is full") {
		t.Fatalf("fourth join: %v", err)
	}
	st, err := bootstrap.TokenStatus(ctx, cli, tok)
	if err != nil || len(st.Members) != 3 || st.State != bootstrap.StateFull {
		t.Fatalf("status after the fourth: %+v, %v", st, err)
	}

	// A member that restarts and joins again gets the same answer.
	again, err := bootstrap.Join(ctx, cfg, "m2", []string{peerURL(1)})
	if err != nil || again.InitialCluster != first.InitialCluster {
		t.Fatalf("rejoin: %q, %v", again.InitialCluster, err)
	}
}

func TestJoinReportsProgress(t *testing.T) {
	srv := registryServer(t)
	tok, _ := createToken(t, 2)
	cfg := config(srv, tok)
	ctx := testCtx(t, 20*time.Second)

	progress := make(chan bootstrap.Progress, 10)
	first := joinAsync(t, ctx, cfg, "a", peerURL(0), bootstrap.WithProgress(func(p bootstrap.Progress) { progress <- p }))
	p := await(t, progress, "first progress")
	if p.Size != 2 || p.Registered != 1 || p.Members[0].Name != "a" || p.String() != "1 of 2 members registered (a)" {
		t.Fatalf("first progress %+v %q", p, p)
	}
	if _, err := bootstrap.Join(ctx, cfg, "b", []string{peerURL(1)}); err != nil {
		t.Fatal(err)
	}
	p = await(t, progress, "second progress")
	if p.Registered != 2 || p.String() != "2 of 2 members registered (a, b)" {
		t.Fatalf("second progress %+v", p)
	}
	if r := await(t, first, "first join"); r.err != nil || r.cluster.InitialCluster != "a="+peerURL(0)+",b="+peerURL(1) {
		t.Fatalf("first join: %+v", r)
	}
}

// noRetries is a progress callback that fails the test on any retry
// (a retry is reported before its backoff).
func noRetries(t *testing.T, what string) bootstrap.Option {
	return bootstrap.WithProgress(func(p bootstrap.Progress) {
		if p.Err != nil {
			t.Errorf("%s: retried (%v); it must fail at once", what, p.Err)
		}
	})
}

func TestJoinFailsAtOnceOnMissingOrBadSize(t *testing.T) {
	srv := registryServer(t)
	cli := client(t, srv)
	ctx := testCtx(t, 20*time.Second)
	cfg := config(srv, newToken(t))
	if _, err := bootstrap.Join(ctx, cfg, "a", []string{peerURL(0)}, noRetries(t, "no token")); !errors.Is(err, bootstrap.ErrSizeNotFound) ||
		!strings.Contains(err.Error(), "discovery: size key not found") {
		t.Fatalf("no token: %v", err)
	}
	for _, bad := range []string{"0", "-2", "three", " 3"} {
		tok := newToken(t)
		if _, err := cli.Put(ctx, bootstrap.SizeKey(tok), bad); err != nil {
			t.Fatal(err)
		}
		cfg := config(srv, tok)
		if _, err := bootstrap.GetCluster(ctx, cfg, noRetries(t, "size "+bad)); !errors.Is(err, bootstrap.ErrBadSizeKey) {
			t.Fatalf("size %q: %v", bad, err)
		}
	}
}

func TestJoinUnreachableServiceRetriesUntilDeadline(t *testing.T) {
	port, err := etcdtest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	cfg := bootstrap.Config{
		Token:           "unreachable",
		Endpoints:       []string{"http://127.0.0.1:" + itoa(port)},
		RequestTimeout:  200 * time.Millisecond,
		RetryBackoff:    50 * time.Millisecond,
		MaxRetryBackoff: 100 * time.Millisecond,
	}
	var mu sync.Mutex
	var retries []bootstrap.Progress
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = bootstrap.Join(ctx, cfg, "a", []string{peerURL(0)}, bootstrap.WithProgress(func(p bootstrap.Progress) {
		mu.Lock()
		defer mu.Unlock()
		retries = append(retries, p)
	}))
	if !errors.Is(err, bootstrap.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("unreachable: %v", err)
	}
	// Bounded by the deadline, give or take scheduling on a loaded
	// machine (it would otherwise retry forever).
	deadline, _ := ctx.Deadline()
	if late := time.Since(deadline); late > 5*time.Second {
		t.Fatalf("Join returned %v after its deadline (started %v before it)", late, deadline.Sub(start))
	}
	mu.Lock()
	defer mu.Unlock()
	if len(retries) < 2 || retries[0].Err == nil || retries[0].Attempt != 1 || retries[1].Attempt != 2 {
		t.Fatalf("retries not reported: %+v", retries)
	}
	if !strings.Contains(retries[0].String(), "discovery service unreachable (attempt 1)") {
		t.Fatalf("progress text %q", retries[0])
	}
	// The etcd client only says its deadline passed; the retry says why.
	if want := "127.0.0.1:" + itoa(port) + ": connect: connection refused"; !strings.Contains(retries[0].Err.Error(), want) ||
		!strings.Contains(err.Error(), want) {
		t.Fatalf("retry %q, error %q: want %q in both", retries[0].Err, err, want)
	}
	t.Logf("error at deadline: %v", err)
}

func itoa(n int) string { return strconv.Itoa(n) }

// The member's watch starts from a revision that compaction removed: it
// re-lists instead of failing or spinning (etcd's own client spins).
func TestJoinSurvivesCompaction(t *testing.T) {
	srv := registryServer(t)
	tok, cli := createToken(t, 2)
	cfg := config(srv, tok)
	ctx := testCtx(t, 20*time.Second)

	hold := make(chan struct{})
	var once sync.Once
	reached := make(chan struct{})
	res := joinAsync(t, ctx, cfg, "a", peerURL(0), bootstrap.WithProgress(func(p bootstrap.Progress) {
		once.Do(func() { close(reached); <-hold }) // before the first watch
	}))
	await(t, reached, "first member registered")
	// b fills the token and so returns without waiting for a watch.
	if _, err := bootstrap.Join(ctx, cfg, "b", []string{peerURL(1)}); err != nil {
		t.Fatalf("second join: %v", err)
	}
	put, err := cli.Put(ctx, "/unrelated", "x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(ctx, put.Header.Revision); err != nil {
		t.Fatal(err)
	}
	close(hold)
	r := await(t, res, "join after compaction")
	if r.err != nil || len(r.cluster.Members) != 2 {
		t.Fatalf("join after compaction: %+v", r)
	}
}

func TestTokenRemovedWhileWaiting(t *testing.T) {
	srv := registryServer(t)
	tok, cli := createToken(t, 3)
	ctx := testCtx(t, 20*time.Second)
	progress := make(chan bootstrap.Progress, 10)
	res := joinAsync(t, ctx, config(srv, tok), "a", peerURL(0), bootstrap.WithProgress(func(p bootstrap.Progress) { progress <- p }))
	await(t, progress, "registered")
	if _, err := bootstrap.RemoveToken(ctx, cli, tok); err != nil {
		t.Fatal(err)
	}
	if r := await(t, res, "join"); !errors.Is(r.err, bootstrap.ErrSizeNotFound) {
		t.Fatalf("join after token removal: %v", r.err)
	}
}

func TestDeletedRegistrationIsWrittenAgain(t *testing.T) {
	srv := registryServer(t)
	tok, cli := createToken(t, 2)
	ctx := testCtx(t, 20*time.Second)
	cfg := config(srv, tok)
	progress := make(chan bootstrap.Progress, 10)
	res := joinAsync(t, ctx, cfg, "a", peerURL(0), bootstrap.WithProgress(func(p bootstrap.Progress) { progress <- p }))
	await(t, progress, "registered")
	id, _ := bootstrap.MemberID([]string{peerURL(0)}, tok)
	key := bootstrap.MemberKey(tok, id)
	del, err := cli.Delete(ctx, key)
	if err != nil || del.Deleted != 1 {
		t.Fatalf("delete: %v", err)
	}
	// Wait for the member to write its key again.
	w := cli.Watch(ctx, key, clientv3.WithRev(del.Header.Revision+1))
	for ev := range w {
		if len(ev.Events) > 0 && ev.Events[0].IsCreate() {
			break
		}
	}
	if _, err := bootstrap.Join(ctx, cfg, "b", []string{peerURL(1)}); err != nil {
		t.Fatal(err)
	}
	if r := await(t, res, "join"); r.err != nil || len(r.cluster.Members) != 2 || r.cluster.Members[0].Name != "a" {
		t.Fatalf("join: %+v", r)
	}
}

func TestRestartedMemberKeepsItsPlace(t *testing.T) {
	srv := registryServer(t)
	tok, _ := createToken(t, 3)
	cfg := config(srv, tok)
	ctx := testCtx(t, 20*time.Second)

	// a registers, then "crashes" (its context ends) while waiting.
	crash, cancel := context.WithCancel(ctx)
	progress := make(chan bootstrap.Progress, 10)
	res := joinAsync(t, crash, cfg, "a", peerURL(0), bootstrap.WithProgress(func(p bootstrap.Progress) { progress <- p }))
	await(t, progress, "a registered")
	cancel()
	if r := await(t, res, "a"); !errors.Is(r.err, context.Canceled) || !strings.Contains(r.err.Error(), "1 of 3 members registered (a)") {
		t.Fatalf("cancelled join: %v", r.err)
	}
	b := joinAsync(t, ctx, cfg, "b", peerURL(1))
	a := joinAsync(t, ctx, cfg, "a", peerURL(0)) // restarted
	c := joinAsync(t, ctx, cfg, "c", peerURL(2))
	for _, ch := range []<-chan joinResult{a, b, c} {
		r := await(t, ch, "join")
		if r.err != nil {
			t.Fatal(r.err)
		}
		if got := r.cluster.Members[0].Name; got != "a" {
			t.Fatalf("first member %s, want a (registered first)", got)
		}
	}
}

func TestDuplicateNameOrURLIsRefused(t *testing.T) {
	srv := registryServer(t)
	tok, cli := createToken(t, 3)
	cfg := config(srv, tok)
	ctx := testCtx(t, 20*time.Second)
	if _, err := cli.Put(ctx, bootstrap.MembersPrefix(tok)+"/1", "a="+peerURL(0)); err != nil {
		t.Fatal(err)
	}
	if _, err := bootstrap.Join(ctx, cfg, "a", []string{peerURL(5)}); !errors.Is(err, bootstrap.ErrDuplicateName) {
		t.Fatalf("duplicate name: %v", err)
	}
	if _, err := bootstrap.Join(ctx, cfg, "z", []string{peerURL(6), peerURL(0)}); !errors.Is(err, bootstrap.ErrDuplicateURL) {
		t.Fatalf("duplicate URL: %v", err)
	}
	if _, err := bootstrap.Join(ctx, cfg, "z", []string{"10.0.0.1:2380"}); !errors.Is(err, bootstrap.ErrInvalidMember) {
		t.Fatalf("malformed URL: %v", err)
	}
	if _, err := bootstrap.Join(ctx, cfg, "z=1", []string{peerURL(7)}); !errors.Is(err, bootstrap.ErrInvalidMember) {
		t.Fatalf("malformed name: %v", err)
	}
}

func TestGetClusterReturnsFirstNOfAFullToken(t *testing.T) {
	srv := registryServer(t)
	tok, cli := createToken(t, 2)
	cfg := config(srv, tok)
	ctx := testCtx(t, 20*time.Second)

	// GetCluster waits while the token is not full.
	got := make(chan joinResult, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		c, err := bootstrap.GetCluster(ctx, cfg)
		got <- joinResult{c, err}
	}()
	t.Cleanup(wg.Wait)
	for i, n := range []string{"x", "y", "z"} { // written as etcd writes them
		id, _ := bootstrap.MemberID([]string{peerURL(i)}, tok)
		if _, err := cli.Put(ctx, bootstrap.MemberKey(tok, id), n+"="+peerURL(i)); err != nil {
			t.Fatal(err)
		}
	}
	r := await(t, got, "GetCluster")
	if r.err != nil || r.cluster.InitialCluster != "x="+peerURL(0)+",y="+peerURL(1) {
		t.Fatalf("GetCluster while waiting: %+v", r)
	}
	full, err := bootstrap.GetCluster(ctx, cfg)
	if err != nil || full.InitialCluster != r.cluster.InitialCluster {
		t.Fatalf("GetCluster of a full token: %+v, %v", full, err)
	}
	st, err := bootstrap.TokenStatus(ctx, cli, tok)
	if err != nil || len(st.Late()) != 1 || st.Late()[0].Name != "z" {
		t.Fatalf("status: %+v, %v", st, err)
	}
}

func TestConfigValidate(t *testing.T) {
	ok := bootstrap.Config{Token: "t", Endpoints: []string{"http://127.0.0.1:2379"}}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mut := range map[string]func(*bootstrap.Config){
		"no token":        func(c *bootstrap.Config) { c.Token = "" },
		"bad token":       func(c *bootstrap.Config) { c.Token = "a/b" },
		"no endpoints":    func(c *bootstrap.Config) { c.Endpoints = nil },
		"empty endpoint":  func(c *bootstrap.Config) { c.Endpoints = []string{" "} },
		"joined":          func(c *bootstrap.Config) { c.Endpoints = []string{"a:1,b:2"} },
		"negative":        func(c *bootstrap.Config) { c.RequestTimeout = -time.Second },
		"backoff order":   func(c *bootstrap.Config) { c.RetryBackoff, c.MaxRetryBackoff = time.Minute, time.Second },
		"cert but no key": func(c *bootstrap.Config) { c.CertFile = "c.pem" },
	} {
		c := ok
		mut(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		} else if !errors.Is(err, bootstrap.ErrInvalidConfig) && !errors.Is(err, bootstrap.ErrInvalidToken) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// Discovery over TLS with client certificates and user/password, and a
// clear, unretried error for a wrong password.
func TestJoinOverTLSWithAuth(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{Name: "secure-registry", TLS: true, User: "disc", Password: "s3cret"})
	cli := client(t, srv)
	ctx := testCtx(t, 20*time.Second)
	tok := newToken(t)
	if _, err := bootstrap.CreateToken(ctx, cli, tok, 1); err != nil {
		t.Fatal(err)
	}
	certs := srv.Certs()
	cfg := bootstrap.Config{
		Token: tok, Endpoints: srv.Endpoints(),
		CertFile: certs.ClientCert, KeyFile: certs.ClientKey, CACertFile: certs.CA,
		User: "disc:s3cret",
	}
	c, err := bootstrap.Join(ctx, cfg, "solo", []string{peerURL(0)})
	if err != nil || c.InitialCluster != "solo="+peerURL(0) {
		t.Fatalf("join over TLS: %+v, %v", c, err)
	}
	cfg.User, cfg.Password = "disc", "wrong"
	if _, err := bootstrap.GetCluster(ctx, cfg, noRetries(t, "wrong password")); !errors.Is(err, bootstrap.ErrAccessDenied) {
		t.Fatalf("wrong password: %v", err)
	}
}

// The registry goes down while a member waits for its peers and comes
// back: the wait survives the broken watch (re-reading the registry when
// it answers again) and ends when the last member registers.
func TestJoinSurvivesRegistryOutage(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{Name: "outage-registry"})
	ctx := testCtx(t, 60*time.Second)
	tok := newToken(t)
	if _, err := bootstrap.CreateToken(ctx, client(t, srv), tok, 2); err != nil {
		t.Fatal(err)
	}
	cfg := config(srv, tok)
	progress := make(chan bootstrap.Progress, 100)
	res := joinAsync(t, ctx, cfg, "a", peerURL(0), bootstrap.WithProgress(func(p bootstrap.Progress) {
		select {
		case progress <- p:
		default:
		}
	}))
	if p := await(t, progress, "a registered"); p.Registered != 1 {
		t.Fatalf("first progress: %+v", p)
	}
	srv.Stop()
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	if _, err := bootstrap.Join(ctx, cfg, "b", []string{peerURL(1)}); err != nil {
		t.Fatalf("join after the outage: %v", err)
	}
	r := await(t, res, "the waiting member")
	if r.err != nil || r.cluster.InitialCluster != "a="+peerURL(0)+",b="+peerURL(1) {
		t.Fatalf("waiting member after the outage: %+v", r)
	}
}

// An identical peer URL set under another name is another member, not a
// restart: it is refused and never overwrites the first registration.
func TestSamePeerURLsUnderAnotherNameIsRefused(t *testing.T) {
	srv := registryServer(t)
	tok, cli := createToken(t, 3)
	cfg := config(srv, tok)
	ctx := testCtx(t, 20*time.Second)

	crash, cancel := context.WithCancel(ctx)
	progress := make(chan bootstrap.Progress, 10)
	n0 := joinAsync(t, crash, cfg, "n0", peerURL(0), bootstrap.WithProgress(func(p bootstrap.Progress) { progress <- p }))
	await(t, progress, "n0 registered")

	_, err := bootstrap.Join(ctx, cfg, "n1", []string{peerURL(0)})
	if !errors.Is(err, bootstrap.ErrDuplicateURL) || !strings.Contains(err.Error(), `"n0"`) {
		t.Fatalf("n1 with n0's peer URL: %v, want %v naming n0", err, bootstrap.ErrDuplicateURL)
	}
	st, err := bootstrap.TokenStatus(ctx, cli, tok)
	if err != nil || len(st.Members) != 1 || st.Members[0].Name != "n0" {
		t.Fatalf("registry after n1: %+v, %v", st.Members, err)
	}

	// n0 restarting (same name, same URLs) keeps its place.
	cancel()
	await(t, n0, "n0 cancelled")
	n0again := joinAsync(t, ctx, cfg, "n0", peerURL(0))
	b := joinAsync(t, ctx, cfg, "b", peerURL(1))
	c := joinAsync(t, ctx, cfg, "c", peerURL(2))
	for _, ch := range []<-chan joinResult{n0again, b, c} {
		if r := await(t, ch, "join"); r.err != nil || r.cluster.Members[0].Name != "n0" {
			t.Fatalf("join after restart: %+v", r)
		}
	}
}

// Members that join at the same moment with the same peer URLs, or with
// the same name, cannot both register: exactly one does, the others are
// refused.
func TestRacingJoinersWithOnePeerURLSetOrNameRegisterOnce(t *testing.T) {
	srv := registryServer(t)
	for _, tc := range []struct {
		what string
		name func(i int) string
		url  func(i int) string
		want error
	}{
		{"same peer URLs", func(i int) string { return "n" + strconv.Itoa(i) }, func(int) string { return peerURL(0) }, bootstrap.ErrDuplicateURL},
		{"same name", func(int) string { return "same" }, peerURL, bootstrap.ErrDuplicateName},
	} {
		t.Run(tc.what, func(t *testing.T) {
			tok, cli := createToken(t, 5)
			cfg := config(srv, tok)
			ctx := testCtx(t, 20*time.Second)
			joins, cancel := context.WithCancel(ctx)
			defer cancel()
			const n = 4
			results := make(chan error, n)
			var wg sync.WaitGroup
			t.Cleanup(wg.Wait)
			for i := range n {
				wg.Go(func() {
					_, err := bootstrap.Join(joins, cfg, tc.name(i), []string{tc.url(i)})
					results <- err
				})
			}
			for refused := 0; refused < n-1; refused++ {
				select {
				case err := <-results:
					if !errors.Is(err, tc.want) {
						t.Fatalf("join: %v, want %v", err, tc.want)
					}
				case <-time.After(5 * time.Second):
					st, _ := bootstrap.TokenStatus(ctx, cli, tok)
					t.Fatalf("%d of %d joiners refused after 5 s; registry: %+v", refused, n-1, st.Members)
				}
			}
			st, err := bootstrap.TokenStatus(ctx, cli, tok)
			if err != nil || len(st.Members) != 1 {
				t.Fatalf("registry: %+v, %v; want one member", st.Members, err)
			}
		})
	}
}

// A name claim whose registration was deleted by hand does not keep the
// name: a member with that name and new peer URLs can join.
func TestStaleNameClaimIsTakenOver(t *testing.T) {
	srv := registryServer(t)
	tok, cli := createToken(t, 1)
	cfg := config(srv, tok)
	ctx := testCtx(t, 20*time.Second)
	first, err := bootstrap.Join(ctx, cfg, "a", []string{peerURL(0)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Delete(ctx, first.Members[0].Key); err != nil {
		t.Fatal(err)
	}
	again, err := bootstrap.Join(ctx, cfg, "a", []string{peerURL(1)})
	if err != nil || again.Members[0].PeerURLs[0] != peerURL(1) {
		t.Fatalf("join after the deletion: %+v, %v", again, err)
	}
}
