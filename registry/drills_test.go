package registry_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/lab/netcut"
	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/registry/registrytest"
	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
)

// Fault drills against real embedded etcd. Leases are etcd's shortest
// (2 s) to keep them fast; every wait is on an event with a deadline.

// TestDrillSIGKILL (drill a): a registrant process killed with SIGKILL
// (no deregistration, no revoke) disappears from watchers within the lease
// TTL + 1 s, and nothing is removed before the kill.
//
// Not parallel: its bound (TTL + 1 s, etcd's 500 ms expiry check included)
// leaves the least slack of the drills, so it runs while the package's
// heavy parallel drills (2,000 updates, an etcd restart) wait.
func TestDrillSIGKILL(t *testing.T) {
	ns := uniqueNS()
	const n = 5
	watching := newRegistry(t, newEtcdStore(t, nil, etcd.Config{}), registry.Config{})
	ctx := within(t, 60*time.Second)
	q := beacon.Query{Namespace: ns}
	w, err := watching.Watch(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	v := registrytest.NewView()
	next(t, ctx, w, v)

	c := startChild(t, server.Endpoints(), ns, n, etcdTTL)
	for v.Len() < n {
		b := next(t, ctx, w, v)
		for _, e := range b.Events {
			if e.Type == beacon.Removed {
				t.Fatalf("false removal of %s before the kill", e.Instance.Ref())
			}
		}
	}
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	for v.Len() > 0 {
		next(t, ctx, w, v)
	}
	took := time.Since(killed)
	t.Logf("SIGKILL → all %d instances removed after %v (TTL %v)", n, took.Round(time.Millisecond), etcdTTL)
	if took > etcdTTL+time.Second {
		t.Fatalf("removal took %v, more than TTL + 1 s", took)
	}
}

// TestDrillEtcdRestart (drill b): etcd stops for 2 × TTL and restarts on the
// same data directory. Watchers report stale during the outage; the
// registrant's session reports its lease unconfirmed, never lost (etcd
// cannot say), and within one TTL of etcd's return either confirmed (etcd
// kept the lease) or, only once etcd says the lease ended, lost and
// recovered, with every instance under its ID; a registrant that died
// during the outage is removed; watchers converge to exactly the live set.
func TestDrillEtcdRestart(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t, etcdtest.Options{})
	// The etcd client's reconnect backoff (up to 5 s in store/etcd) bounds
	// how soon any client finds etcd again; with 2 s leases the drill
	// needs it below the TTL. (With the default 10 s TTL the default is
	// fine.)
	cfg := etcd.Config{Endpoints: srv.Endpoints(), RequestTimeout: 500 * time.Millisecond, Configure: fastReconnect}
	ctx := within(t, 120*time.Second)
	ns := uniqueNS()
	q := beacon.Query{Namespace: ns}

	live := newRegistry(t, newEtcdStore(t, srv, cfg), registry.Config{LeaseTTL: etcdTTL})
	doomedStore := newEtcdStore(t, srv, cfg)
	doomed := newRegistry(t, doomedStore, registry.Config{LeaseTTL: etcdTTL})
	watching := newRegistry(t, newEtcdStore(t, srv, cfg), registry.Config{LeaseTTL: etcdTTL})
	for i := range 20 {
		if _, err := live.Register(ctx, inst(ns, fmt.Sprintf("10.0.0.%d:80", i+1))); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 5 {
		if _, err := doomed.Register(ctx, inst(ns, fmt.Sprintf("10.9.0.%d:80", i+1))); err != nil {
			t.Fatal(err)
		}
	}
	waitState(t, live, 5*time.Second, registry.StateActive)
	w, err := watching.Watch(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	v := registrytest.NewView()
	for v.Len() < 25 {
		next(t, ctx, w, v)
	}
	wantLive, _, err := live.List(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	var liveOnly []beacon.Instance
	for _, in := range wantLive {
		if in.Address[:5] == "10.0." {
			liveOnly = append(liveOnly, in)
		}
	}

	stopped := time.Now()
	srv.Stop()
	t.Logf("etcd stopped in %v", time.Since(stopped).Round(time.Millisecond))
	// The doomed process dies during the outage: it can neither keep its
	// lease alive nor revoke it.
	_ = doomedStore.Close()

	// During the outage: the session reports its lease unconfirmed (never
	// lost), the watcher stale. etcd stops gracefully: for up to its
	// request timeout (7 s) it refuses new calls, the sessions' keep-alives
	// among them, while the streams already open still carry events and
	// its lessor still runs. A 2 s lease may then end before etcd stops,
	// and the watch, live until then, delivers its keys' removals: etcd's
	// own (and the session then learns that etcd ended it, below). Any
	// other change during the outage would be one etcd never made.
	held := live.Lease()
	outage := time.After(2 * etcdTTL)
	sawUnconfirmed, sawStale := false, false
	removedByEtcd := 0
	for !sawUnconfirmed || !sawStale {
		select {
		case c := <-live.States():
			if c.State == registry.StateLost {
				t.Fatalf("session reported its lease lost while etcd could not be asked: %v", c.Err)
			}
			sawUnconfirmed = sawUnconfirmed || errors.Is(c.Err, registry.ErrLeaseUnconfirmed)
		case <-outage:
			t.Fatalf("after 2 × TTL of outage: unconfirmed reported %v, stale reported %v", sawUnconfirmed, sawStale)
		default:
			nctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			b, err := w.Next(nctx)
			cancel()
			if err == nil {
				if err := v.Apply(b); err != nil {
					t.Fatal(err)
				}
				sawStale = sawStale || b.Kind == registry.Stale
				for _, e := range b.Events {
					if e.Type != beacon.Removed || sawStale {
						t.Fatalf("event during the outage (a %v batch): %v %s", b.Kind, e.Type, e.Instance.Ref())
					}
					removedByEtcd++
				}
			}
		}
	}
	if v.Len()+removedByEtcd != 25 {
		t.Fatalf("the stale view changed during the outage: %v", v)
	}
	<-outage

	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	// Back, etcd says: either it kept the lease (a restarted member
	// extends every lease as it becomes leader: confirmed, the same lease)
	// or it ended it (its lessor expired it before it stopped: lost, with
	// etcd's answer, then recovered under a new lease).
	var rec registry.StateChange
	for done := false; !done; {
		select {
		case rec = <-live.States():
			switch {
			case rec.State == registry.StateLost && !errors.Is(rec.Err, store.ErrLeaseNotFound):
				t.Fatalf("session reported its lease lost without etcd saying it ended: %v", rec.Err)
			case rec.State == registry.StateLost:
				t.Logf("etcd ended the lease while it stopped: %v", rec.Err)
			case rec.State == registry.StateRecovered:
				done = true
			case rec.State == registry.StateActive && rec.Err == nil:
				if rec.Lease != held {
					t.Fatalf("confirmed lease %x, held %x", rec.Lease, held)
				}
				done = true
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("neither confirmed nor recovered within 10 s of etcd's return (state %v)", live.State())
		}
	}
	recoveredIn := time.Since(back)
	if removedByEtcd > 0 && rec.State != registry.StateRecovered {
		t.Fatalf("the watcher saw %d removals while etcd stopped, yet etcd kept the session's lease", removedByEtcd)
	}
	if rec.Registered != 20 || len(rec.Conflicts) != 0 {
		t.Fatalf("after etcd's return: %+v, want 20 registered", rec)
	}
	// Every registration is back, under its ID.
	got, _, err := live.List(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, in := range got {
		have[in.Ref().String()] = true
	}
	for _, in := range liveOnly {
		if !have[in.Ref().String()] {
			t.Fatalf("%s not registered after the recovery", in.Ref())
		}
	}
	// The watcher converges to exactly the live set (the doomed lease
	// expires one TTL after etcd's return).
	deadline := time.Now().Add(2*etcdTTL + 2*time.Second)
	sawResync := false
	for !v.Equal(liveOnly) {
		nctx, cancel := context.WithDeadline(ctx, deadline)
		b, err := w.Next(nctx)
		cancel()
		if err != nil {
			t.Fatalf("watcher did not converge to the 20 live instances: %v (view has %d)", err, v.Len())
		}
		sawResync = sawResync || b.Kind == registry.Resync
		if err := v.Apply(b); err != nil {
			t.Fatal(err)
		}
	}
	converged := time.Since(back)
	t.Logf("etcd back: session confirmed or recovered its lease in %v, watcher converged to the live set in %v (resync batch: %v; removals etcd made while it stopped: %d)",
		recoveredIn.Round(time.Millisecond), converged.Round(time.Millisecond), sawResync, removedByEtcd)
	if recoveredIn > etcdTTL {
		t.Fatalf("session confirmed or recovered its lease %v after etcd's return, more than one TTL", recoveredIn)
	}
	if !sawResync {
		t.Fatal("no resync batch after the stale one")
	}
}

// fastReconnect caps the etcd client's reconnect backoff at 500 ms.
func fastReconnect(c *clientv3.Config) {
	c.DialOptions = append(c.DialOptions, grpc.WithConnectParams(grpc.ConnectParams{
		Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 500 * time.Millisecond},
		MinConnectTimeout: time.Second,
	}))
}

// cutRegistry returns a registry that reaches srv through a connection the
// test can cut, and that cut-able proxy. Its watches deliver removals at
// once (RemovalHold negative): the tests check the exact resync batch.
func cutRegistry(t *testing.T, srv *etcdtest.Server) (*netcut.Proxy, *registry.StoreRegistry) {
	t.Helper()
	u, err := url.Parse(srv.Endpoint())
	if err != nil {
		t.Fatal(err)
	}
	proxy := startProxy(t, u.Host)
	st := newEtcdStore(t, nil, etcd.Config{Endpoints: []string{proxy.Endpoint()}, RequestTimeout: 500 * time.Millisecond})
	return proxy, newRegistry(t, st, registry.Config{LeaseTTL: etcdTTL, RemovalHold: -1})
}

func startProxy(t *testing.T, target string) *netcut.Proxy {
	t.Helper()
	p, err := netcut.Start(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// TestDrillCompactionWhileDisconnected (drill c): a watcher's connection to
// etcd is cut; meanwhile instances are added, changed, removed, one comes
// and goes, and etcd compacts its history past the watcher's position. Once
// the connection is back, the watcher delivers exactly the difference:
// Added for the new one, Updated for the changed address, Removed for the
// gone one, and nothing for the one it never saw.
func TestDrillCompactionWhileDisconnected(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t, etcdtest.Options{})
	proxy, watching := cutRegistry(t, srv)
	ctx := within(t, 60*time.Second)
	ns := uniqueNS()
	q := beacon.Query{Namespace: ns}

	direct := newEtcdStore(t, srv, etcd.Config{})
	reg := newRegistry(t, direct, registry.Config{LeaseTTL: etcdTTL})

	a, err := reg.Register(ctx, inst(ns, "10.0.0.1:80"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := reg.Register(ctx, inst(ns, "10.0.0.2:80"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := reg.Register(ctx, inst(ns, "10.0.0.3:80"))
	if err != nil {
		t.Fatal(err)
	}
	w, err := watching.Watch(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	v := registrytest.NewView()
	for v.Len() < 3 {
		next(t, ctx, w, v)
	}

	proxy.Cut()
	if err := a.Update(ctx, func(in *beacon.Instance) { in.Address = "10.1.0.1:80" }); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	d, err := reg.Register(ctx, inst(ns, "10.0.0.4:80"))
	if err != nil {
		t.Fatal(err)
	}
	phantom, err := reg.Register(ctx, inst(ns, "10.0.0.5:80"))
	if err != nil {
		t.Fatal(err)
	}
	if err := phantom.Close(); err != nil {
		t.Fatal(err)
	}
	_, rev, err := direct.List(ctx, "/")
	if err != nil {
		t.Fatal(err)
	}
	if err := direct.Compact(ctx, rev); err != nil {
		t.Fatal(err)
	}

	// The watcher notices it cannot reach etcd...
	for {
		nb := next(t, ctx, w, v)
		if len(nb.Events) != 0 {
			t.Fatalf("events while disconnected: %+v", nb.Events)
		}
		if nb.Kind == registry.Stale {
			break
		}
	}
	proxy.Restore()
	// ...and, once back, delivers exactly the difference.
	got := map[string]beacon.EventType{}
	for {
		nb := next(t, ctx, w, v)
		if nb.Kind == registry.Stale {
			continue
		}
		if nb.Kind != registry.Resync {
			t.Fatalf("first batch after reconnecting is %v, want resync", nb.Kind)
		}
		for _, e := range nb.Events {
			got[e.Instance.Address] = e.Type
		}
		break
	}
	want := map[string]beacon.EventType{"10.1.0.1:80": beacon.Updated, "10.0.0.2:80": beacon.Removed, "10.0.0.4:80": beacon.Added}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("resync delivered %v, want %v", got, want)
	}
	list, _, err := reg.List(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	if !v.Equal(list) {
		t.Fatalf("watcher %v, List %d", v, len(list))
	}
	_, _ = c, d
}

// TestDrillSlowConsumer (drill d): one consumer that does not read while
// 2,000 changes happen never holds back ten fast consumers of the same
// shared watch, and catches up with one event per changed instance.
func TestDrillSlowConsumer(t *testing.T) {
	t.Parallel()
	ctx := within(t, 120*time.Second)
	ns := uniqueNS()
	q := beacon.Query{Namespace: ns}
	writer := newRegistry(t, newEtcdStore(t, nil, etcd.Config{}), registry.Config{LeaseTTL: etcdTTL})
	watching := newRegistry(t, newEtcdStore(t, nil, etcd.Config{}), registry.Config{})
	const instances, updates, fastN = 20, 2000, 10
	var regs []registry.Registration
	for i := range instances {
		reg, err := writer.Register(ctx, inst(ns, fmt.Sprintf("10.0.0.%d:80", i+1)))
		if err != nil {
			t.Fatal(err)
		}
		regs = append(regs, reg)
	}
	open := func() (registry.Watcher, *registrytest.View) {
		w, err := watching.Watch(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = w.Close() })
		v := registrytest.NewView()
		next(t, ctx, w, v)
		return w, v
	}
	slow, sv := open()
	// The address of instance i after the last update.
	lastRound := updates/instances - 1
	final := func(i int) string {
		return fmt.Sprintf("10.%d.%d.%d:80", lastRound/250, lastRound%250, i+1)
	}
	ids := make([]string, instances)
	for i, reg := range regs {
		ids[i] = reg.Instance().Ref().String()
	}
	// atFinal reports whether v holds every instance at its last address:
	// the shared feed has applied every update.
	atFinal := func(v *registrytest.View) bool {
		for i, id := range ids {
			if in, _ := v.Get(id); in.Address != final(i) {
				return false
			}
		}
		return true
	}
	var wg sync.WaitGroup
	errs := make(chan error, fastN)
	for range fastN {
		w, v := open()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				b, err := w.Next(ctx)
				if err != nil {
					errs <- err
					return
				}
				if err := v.Apply(b); err != nil {
					errs <- err
					return
				}
				if atFinal(v) {
					return
				}
			}
		}()
	}
	start := time.Now()
	for u := range updates {
		reg := regs[u%instances]
		round := u / instances
		if err := reg.Update(ctx, func(in *beacon.Instance) {
			in.Address = fmt.Sprintf("10.%d.%d.%d:80", round/250, round%250, u%instances+1)
		}); err != nil {
			t.Fatal(err)
		}
	}
	wrote := time.Since(start)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case err := <-errs:
		t.Fatal(err)
	case <-time.After(30 * time.Second):
		t.Fatal("fast consumers did not reach the final state while the slow one was idle")
	}
	caughtUp := time.Since(start)
	before := sv.Events
	want, _, err := watching.List(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	// The fast consumers saw the final state, so the feed holds it: the
	// slow one gets there with one event per instance (in one batch, or
	// two around a Stale one if the machine is slow enough for the
	// reachability probe to time out).
	for !sv.Equal(want) {
		next(t, ctx, slow, sv)
	}
	if !atFinal(sv) {
		t.Fatalf("slow consumer converged to the listing but not to the last updates: %v", sv)
	}
	t.Logf("%d updates written in %v; %d fast consumers had them all %v after the first write; the slow one caught up with %d events",
		updates, wrote.Round(time.Millisecond), fastN, caughtUp.Round(time.Millisecond), sv.Events-before)
	if n := sv.Events - before; n > instances {
		t.Fatalf("slow consumer caught up with %d events for %d instances", n, instances)
	}
}
