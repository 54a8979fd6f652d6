package etcdnaming_test

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/lab/netcut"
	"github.com/beaconplane/beacon/internal/testkit/storefault"
	"github.com/beaconplane/beacon/naming/etcdnaming"
	"github.com/beaconplane/beacon/naming/internal/cctest"
	"github.com/beaconplane/beacon/naming/namingtest"
	"github.com/beaconplane/beacon/store/etcd"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	etcdendpoints "go.etcd.io/etcd/client/v3/naming/endpoints"
	etcdresolver "go.etcd.io/etcd/client/v3/naming/resolver"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/resolver"
)

// Interoperability with etcd's own naming packages (etcd client 3.7.3)
// over a real etcd, with real gRPC servers and channels.

// etcdStore wraps a new etcd client (a new "process") in a Store.
func etcdStore(t *testing.T, cli *clientv3.Client) *etcd.Store {
	t.Helper()
	st := etcd.NewFromClient(cli)
	t.Cleanup(func() { _ = st.Close() })
	return st
}

func dialRR(t *testing.T, target string, b resolver.Builder) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(target, grpc.WithResolvers(b),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// unique returns target with a suffix no other test run uses, since the
// tests share one etcd (also with -count).
func unique(target string) string {
	return fmt.Sprintf("%s-%d", target, runs.Add(1))
}

var runs atomic.Int64

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// etcd's resolver resolves what Beacon's manager writes, and etcd's
// manager sees a Beacon multi-endpoint update as one batch.
func TestEtcdResolverReadsBeaconManager(t *testing.T) {
	ctx := testContext(t)
	target := unique("interop/beacon-writes")
	m := newManager(t, etcdStore(t, server.Client(t)), target)
	b1, b2, b3 := namingtest.Start(t, "b1"), namingtest.Start(t, "b2"), namingtest.Start(t, "b3")
	// Map metadata: etcd's resolver once panicked on it (etcd#19700).
	must(t, m.AddEndpoint(ctx, target+"/"+b1.Addr(), etcdnaming.Endpoint{Addr: b1.Addr(), Metadata: map[string]any{"zone": "a"}}))
	must(t, m.AddEndpoint(ctx, target+"/"+b2.Addr(), etcdnaming.Endpoint{Addr: b2.Addr()}))

	cli := server.Client(t)
	rb, err := etcdresolver.NewBuilder(cli)
	must(t, err)
	cc := dialRR(t, "etcd:///"+target, rb)
	must(t, namingtest.ReachAll(ctx, cc, "b1", "b2"))

	must(t, m.DeleteEndpoint(ctx, target+"/"+b1.Addr()))
	must(t, namingtest.SettleOn(ctx, cc, 20, "b2"))

	// etcd's manager watches; Beacon's atomic update reaches it as one
	// batch of two updates.
	em, err := etcdendpoints.NewManager(cli, target)
	must(t, err)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wch, err := em.NewWatchChannel(wctx)
	must(t, err)
	select {
	case initial := <-wch:
		if len(initial) != 1 || initial[0].Endpoint.Addr != b2.Addr() {
			t.Fatalf("etcd's initial updates: %+v", initial)
		}
	case <-ctx.Done():
		t.Fatal("no initial updates")
	}
	must(t, m.Update(ctx,
		etcdnaming.NewAddUpdate(target+"/"+b3.Addr(), etcdnaming.Endpoint{Addr: b3.Addr(), Metadata: "x"}),
		etcdnaming.NewDeleteUpdate(target+"/"+b2.Addr())))
	select {
	case ups := <-wch:
		if len(ups) != 2 || ups[0].Op != etcdendpoints.Add || ups[0].Endpoint.Addr != b3.Addr() || ups[0].Endpoint.Metadata != "x" ||
			ups[1].Op != etcdendpoints.Delete || ups[1].Key != target+"/"+b2.Addr() {
			t.Fatalf("etcd saw %d updates: %+v %+v", len(ups), ups[0], ups[len(ups)-1])
		}
	case <-ctx.Done():
		t.Fatal("etcd's manager saw no update")
	}
	must(t, namingtest.SettleOn(ctx, cc, 20, "b3"))
}

// Both managers store the same bytes, and each lists what the other wrote.
func TestManagersWriteTheSameBytes(t *testing.T) {
	ctx := testContext(t)
	target := unique("interop/bytes")
	cli := server.Client(t)
	em, err := etcdendpoints.NewManager(cli, target)
	must(t, err)
	m := newManager(t, etcdStore(t, server.Client(t)), target)
	for i, md := range []any{nil, "metadata", map[string]any{"zone": "a", "weight": 3, "tags": []any{"x", true}}, 1.5} {
		addr := "10.0.0.1:" + string(rune('1'+i))
		must(t, em.AddEndpoint(ctx, target+"/etcd-"+addr, etcdendpoints.Endpoint{Addr: addr, Metadata: md}))
		must(t, m.AddEndpoint(ctx, target+"/beacon-"+addr, etcdnaming.Endpoint{Addr: addr, Metadata: md}))
		a, err := cli.Get(ctx, target+"/etcd-"+addr)
		must(t, err)
		b, err := cli.Get(ctx, target+"/beacon-"+addr)
		must(t, err)
		if string(a.Kvs[0].Value) != string(b.Kvs[0].Value) {
			t.Errorf("metadata %v: etcd wrote %s, Beacon %s", md, a.Kvs[0].Value, b.Kvs[0].Value)
		}
	}
	ours, err := m.List(ctx)
	must(t, err)
	theirs, err := em.List(ctx)
	must(t, err)
	if len(ours) != 8 || len(theirs) != 8 {
		t.Fatalf("lists: Beacon %d, etcd %d; want 8 each", len(ours), len(theirs))
	}
	for key, ep := range theirs {
		if ours[key].Addr != ep.Addr || !reflect.DeepEqual(ours[key].Metadata, ep.Metadata) {
			t.Errorf("%s: Beacon read %+v, etcd %+v", key, ours[key], ep)
		}
	}
}

// Beacon's etcd:/// resolver resolves what etcd's manager writes under
// leases, and follows a lease revoke.
func TestBeaconResolverReadsEtcdManager(t *testing.T) {
	ctx := testContext(t)
	target := unique("interop/etcd-writes")
	cli := server.Client(t)
	em, err := etcdendpoints.NewManager(cli, target)
	must(t, err)
	b1, b2 := namingtest.Start(t, "b1"), namingtest.Start(t, "b2")
	leases := map[string]clientv3.LeaseID{}
	for _, be := range []*namingtest.Backend{b1, b2} {
		l, err := cli.Grant(ctx, 30)
		must(t, err)
		leases[be.Name()] = l.ID
		must(t, em.AddEndpoint(ctx, target+"/"+be.Addr(),
			etcdendpoints.Endpoint{Addr: be.Addr(), Metadata: map[string]any{"name": be.Name()}}, clientv3.WithLease(l.ID)))
	}

	st := etcdStore(t, server.Client(t))
	b, err := etcdnaming.NewBuilder(st)
	must(t, err)
	cc := dialRR(t, "etcd:///"+target, b)
	must(t, namingtest.ReachAll(ctx, cc, "b1", "b2"))

	// The metadata etcd wrote reaches balancers as attributes.
	rec := buildResolver(t, st, "etcd:///"+target)
	_, ev := rec.Wait(t, 0, "state of two endpoints", func(e cctest.Event) bool { return e.State != nil && len(e.State.Endpoints) == 2 })
	for _, ep := range ev.State.Endpoints {
		md, _ := etcdnaming.MetadataFrom(ep.Attributes)
		if name := md.(map[string]any)["name"]; name != "b1" && name != "b2" {
			t.Errorf("metadata of %s: %#v", ep.Addresses[0].Addr, md)
		}
	}

	_, err = cli.Revoke(ctx, leases["b1"])
	must(t, err)
	must(t, namingtest.SettleOn(ctx, cc, 20, "b2"))
}

// A partition during which the history is compacted: when the network is
// back, the watches cannot resume. Beacon's resolver re-lists and follows
// the new endpoints; etcd's resolver closes its watch and stays on the old
// list for good (the bug this package exists to fix).
func TestCompactionDuringPartition(t *testing.T) {
	ctx := testContext(t)
	target := unique("interop/compaction")
	direct := server.Client(t)
	m := newManager(t, etcdStore(t, direct), target)
	b1, b2, b3 := namingtest.Start(t, "b1"), namingtest.Start(t, "b2"), namingtest.Start(t, "b3")
	must(t, m.AddEndpoint(ctx, target+"/b1", etcdnaming.Endpoint{Addr: b1.Addr()}))

	// Both resolvers reach etcd through a connection we can cut.
	cut, err := netcut.Start(strings.TrimPrefix(server.Endpoint(), "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cut.Close() })
	viaCut := func() *clientv3.Client {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{cut.Addr()}, DialTimeout: 5 * time.Second})
		must(t, err)
		t.Cleanup(func() { _ = cli.Close() })
		return cli
	}
	theirsCli, oursCli := viaCut(), viaCut()
	rb, err := etcdresolver.NewBuilder(theirsCli)
	must(t, err)
	theirs := dialRR(t, "etcd:///"+target, rb)
	reg := prometheus.NewRegistry()
	// The probe stays out of the way: the compaction alone must bring
	// Beacon's resolver back.
	ob, err := etcdnaming.NewBuilder(etcdStore(t, oursCli), etcdnaming.WithMetrics(reg), etcdnaming.WithProbeInterval(time.Hour))
	must(t, err)
	ours := dialRR(t, "etcd:///"+target, ob)
	must(t, namingtest.ReachAll(ctx, theirs, "b1"))
	must(t, namingtest.ReachAll(ctx, ours, "b1"))

	cut.Cut()
	must(t, m.AddEndpoint(ctx, target+"/b2", etcdnaming.Endpoint{Addr: b2.Addr()}))
	must(t, m.DeleteEndpoint(ctx, target+"/b1"))
	resp, err := direct.Get(ctx, "any")
	must(t, err)
	_, err = direct.Compact(ctx, resp.Header.Revision)
	must(t, err)
	cut.Restore()

	must(t, namingtest.SettleOn(ctx, ours, 20, "b2"))
	if n := counter(t, reg, "beacon_naming_resyncs_total", "compacted"); n < 1 {
		t.Errorf("compaction re-lists counted: %v", n)
	}
	// Once etcd's client is back too, a new endpoint reaches Beacon's
	// channel; etcd's channel still sends everything to b1, which left.
	_, err = theirsCli.Get(ctx, "any")
	must(t, err)
	must(t, m.AddEndpoint(ctx, target+"/b3", etcdnaming.Endpoint{Addr: b3.Addr()}))
	must(t, namingtest.ReachAll(ctx, ours, "b2", "b3"))
	for range 20 {
		name, err := namingtest.Call(ctx, theirs)
		if err != nil || name != "b1" {
			t.Fatalf("etcd's resolver recovered (call to %q, %v): update this test and docs/naming.md", name, err)
		}
	}
}

// While the store is unreachable the resolver reports the stale view (the
// channel keeps the last endpoints); when it answers again the resolver
// re-lists and pushes the full state, including what changed meanwhile.
func TestResolverReportsOutageAndRecovers(t *testing.T) {
	ctx := testContext(t)
	target := unique("interop/outage")
	m := newManager(t, etcdStore(t, server.Client(t)), target)
	must(t, m.AddEndpoint(ctx, target+"/a", etcdnaming.Endpoint{Addr: "10.0.0.1:1"}))

	cut, err := netcut.Start(strings.TrimPrefix(server.Endpoint(), "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cut.Close() })
	st, err := etcd.Open(ctx, etcd.Config{Endpoints: []string{cut.Addr()}})
	must(t, err)
	t.Cleanup(func() { _ = st.Close() })
	reg := prometheus.NewRegistry()
	rec := buildResolver(t, st, "etcd:///"+target, etcdnaming.WithProbeInterval(200*time.Millisecond), etcdnaming.WithMetrics(reg))
	i, _ := rec.WaitState(t, 0, "[10.0.0.1:1]")

	cut.Cut()
	i, err = rec.WaitError(t, i, "store unreachable")
	if !strings.Contains(err.Error(), "etcdnaming: endpoint list may be stale: etcd:///"+target) {
		t.Errorf("error %q does not name the target", err)
	}
	must(t, m.AddEndpoint(ctx, target+"/b", etcdnaming.Endpoint{Addr: "10.0.0.2:1"}))
	cut.Restore()
	rec.WaitState(t, i, "[10.0.0.1:1 10.0.0.2:1]")
	// Whichever came first ends the stale report: the watch delivering b
	// (it resumed without a gap: nothing to re-list) or the probe finding
	// the store again (a re-list).
	t.Logf("re-listings on reconnect: %v", counter(t, reg, "beacon_naming_resyncs_total", "reconnect"))
}

// A store too busy to answer the probe's read in time while its watch
// still delivers (a cluster past its capacity) is not reported stale: the
// watch that delivered while the read waited is live. Once the watch is
// quiet while reads fail, the resolver reports it.
func TestResolverSparesAWatchThatDelivers(t *testing.T) {
	ctx := testContext(t)
	target := unique("interop/busy")
	direct := etcdStore(t, server.Client(t))
	m := newManager(t, direct, target)
	must(t, m.AddEndpoint(ctx, target+"/e1", etcdnaming.Endpoint{Addr: "10.0.0.1:1"}))
	st := storefault.New(etcdStore(t, server.Client(t)), 0)
	rec := buildResolver(t, st, "etcd:///"+target, etcdnaming.WithProbeInterval(100*time.Millisecond))
	t.Cleanup(st.Free)
	i, _ := rec.WaitState(t, 0, "[10.0.0.1:1]")
	st.GoDown()
	want := "[10.0.0.1:1"
	for n := 2; n <= 4; n++ { // each read waits while an endpoint is added and pushed
		<-st.Pinged()
		addr := fmt.Sprintf("10.0.0.%d:1", n)
		must(t, m.AddEndpoint(ctx, fmt.Sprintf("%s/e%d", target, n), etcdnaming.Endpoint{Addr: addr}))
		want += " " + addr
		i, _ = rec.WaitState(t, i, want+"]")
		st.Release()
	}
	for _, e := range rec.Events() {
		if e.Err != nil {
			t.Fatalf("reported %v while its watch delivered", e.Err)
		}
	}
	<-st.Pinged() // now the watch is quiet: stale
	st.Release()
	rec.WaitError(t, i, "store unreachable")
	st.ComeBack()
}

// outageAndBack makes st look unreachable to rec's resolver (serving
// [10.0.0.1:1]) until it reports the stale list, then brings it back and
// waits for the list pushed again.
func outageAndBack(t *testing.T, st *storefault.Store, rec *cctest.ClientConn) {
	t.Helper()
	t.Cleanup(st.Free)
	i, _ := rec.WaitState(t, 0, "[10.0.0.1:1]")
	st.GoDown()
	serveReads(t, st)
	i, _ = rec.WaitError(t, i, "store unreachable")
	st.ComeBack()
	rec.WaitState(t, i, "[10.0.0.1:1]")
}

// serveReads fails every read the probe makes through st (held by
// storefault while down; answered once it comes back) until the test
// ends.
func serveReads(t *testing.T, st *storefault.Store) {
	done, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		for {
			select {
			case <-st.Pinged():
				st.Release()
			case <-done:
				return
			}
		}
	}()
	t.Cleanup(func() { close(done); <-finished })
}

// When the store answers the probe again before the watch delivers, a
// watch that promises progress gets twice its interval to prove itself
// live: its progress ends the stale report without a re-listing (on a
// cluster too busy to answer, a re-listing per channel made it busier).
func TestResolverLeavesAQuietWatchToProveItself(t *testing.T) {
	ctx := testContext(t)
	target := unique("interop/quiet")
	m := newManager(t, etcdStore(t, server.Client(t)), target)
	must(t, m.AddEndpoint(ctx, target+"/e1", etcdnaming.Endpoint{Addr: "10.0.0.1:1"}))
	est, err := etcd.Open(ctx, etcd.Config{Endpoints: server.Endpoints(), WatchSilenceTimeout: 800 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = est.Close() })
	st := storefault.New(est, est.ProgressInterval())
	reg := prometheus.NewRegistry()
	rec := buildResolver(t, st, "etcd:///"+target, etcdnaming.WithProbeInterval(100*time.Millisecond), etcdnaming.WithMetrics(reg))
	outageAndBack(t, st, rec)
	if n := counter(t, reg, "beacon_naming_resyncs_total", "reconnect"); n != 0 {
		t.Errorf("re-listed %v times once the store answered; the watch's progress ends the report", n)
	}
}

// A store that promises progress and does not deliver it (here: the
// memory store's plain watches) has the prefix listed again all the
// same, twice the interval after it answers: a broken promise costs
// time, never a channel stale for good.
func TestResolverRelistsAWatchThatReportsNoProgress(t *testing.T) {
	target := unique("interop/promised")
	mem := memStore(t)
	must(t, newManager(t, mem, target).AddEndpoint(testContext(t), target+"/e1", etcdnaming.Endpoint{Addr: "10.0.0.1:1"}))
	st := storefault.New(mem, 50*time.Millisecond)
	reg := prometheus.NewRegistry()
	rec := buildResolver(t, st, "etcd:///"+target, etcdnaming.WithProbeInterval(100*time.Millisecond), etcdnaming.WithMetrics(reg))
	outageAndBack(t, st, rec)
	if n := counter(t, reg, "beacon_naming_resyncs_total", "reconnect"); n != 1 {
		t.Errorf("re-listed %v times once the store answered, want once (no progress came)", n)
	}
}
