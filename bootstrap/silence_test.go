package bootstrap_test

import (
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon/bootstrap"
	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// TestWaitNoticesSilentService: a member waiting for its peers through a
// discovery service whose only member hangs (SIGSTOP: the connection stays
// open, nothing answers) notices within 1.25 request timeouts that its watch
// is silent and says so (a retry reported to the progress callback), and
// once the service answers again the wait completes.
func TestWaitNoticesSilentService(t *testing.T) {
	t.Parallel()
	c := etcdtest.StartProcessCluster(t, 1, etcdtest.ProcessClusterOptions{})
	service := c.Members()[0]
	cfg := bootstrap.Config{Token: newToken(t), Endpoints: c.Endpoints(), RequestTimeout: time.Second,
		RetryBackoff: 50 * time.Millisecond, MaxRetryBackoff: 200 * time.Millisecond}
	ctx := testCtx(t, time.Minute)
	acfg := clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()}
	admin, err := clientv3.New(acfg)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if _, err := bootstrap.CreateToken(ctx, admin, cfg.Token, 2); err != nil {
		t.Fatal(err)
	}
	progress := make(chan bootstrap.Progress, 100)
	first := joinAsync(t, ctx, cfg, "a", peerURL(0), bootstrap.WithProgress(func(p bootstrap.Progress) {
		select {
		case progress <- p:
		default:
		}
	}))
	// Registered and waiting.
	for p := await(t, progress, "the first registration"); p.Registered != 1; p = await(t, progress, "the first registration") {
	}
	if err := service.Pause(); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	for {
		p := await(t, progress, "a retry after the silence")
		if p.Err != nil && strings.Contains(p.Err.Error(), "silent") {
			took := time.Since(paused)
			t.Logf("silent watch noticed after %v: %v", took.Round(time.Millisecond), p.Err)
			if bound := cfg.RequestTimeout*5/4 + 2*time.Second; took > bound {
				t.Fatalf("took %v, bound %v", took, bound)
			}
			break
		}
	}
	if err := service.Resume(); err != nil {
		t.Fatal(err)
	}
	second := joinAsync(t, ctx, cfg, "b", peerURL(1))
	for _, ch := range []<-chan joinResult{first, second} {
		if r := await(t, ch, "the join"); r.err != nil || len(r.cluster.Members) != 2 {
			t.Fatalf("join: %+v", r)
		}
	}
}

// TestWaitOnQuietServiceIsNotSilent: a member waiting for its peers through
// a healthy discovery service that nobody writes to keeps its watch: no
// retry, no "silent". etcd answers a progress request only once its
// revision has reached the watch's start, and the wait's watch started at
// the revision after its last read: every request timeout `beacon serve`
// logged "discovery service unreachable; retrying" while waiting. The
// service is this test's own: another test's write would advance the
// revision and hide the fault.
func TestWaitOnQuietServiceIsNotSilent(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t, etcdtest.Options{})
	cfg := config(srv, newToken(t))
	cfg.RequestTimeout = time.Second
	ctx := testCtx(t, time.Minute)
	if _, err := bootstrap.CreateToken(ctx, client(t, srv), cfg.Token, 2); err != nil {
		t.Fatal(err)
	}
	progress := make(chan bootstrap.Progress, 100)
	first := joinAsync(t, ctx, cfg, "a", peerURL(0), bootstrap.WithProgress(func(p bootstrap.Progress) {
		select {
		case progress <- p:
		default:
		}
	}))
	for p := await(t, progress, "the first registration"); p.Registered != 1; p = await(t, progress, "the first registration") {
	}
	// Three request timeouts: the watch would have ended within 1.25.
	quiet := time.NewTimer(3 * cfg.RequestTimeout)
	defer quiet.Stop()
	for waiting := true; waiting; {
		select {
		case p := <-progress:
			if p.Err != nil {
				t.Fatalf("waiting on a quiet, healthy service: %v", p.Err)
			}
		case <-quiet.C:
			waiting = false
		}
	}
	second := joinAsync(t, ctx, cfg, "b", peerURL(1))
	for _, ch := range []<-chan joinResult{first, second} {
		if r := await(t, ch, "the join"); r.err != nil || len(r.cluster.Members) != 2 {
			t.Fatalf("join: %+v", r)
		}
	}
}
