package naming_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/lab/etcdproc"
	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"github.com/beaconplane/beacon/naming"
	"github.com/beaconplane/beacon/naming/namingtest"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store/etcd"
	"github.com/prometheus/client_golang/prometheus"
)

// TestResolverOnHungMember: on a real 3-member etcd 3.7 cluster of
// processes, one follower is stopped (SIGSTOP: it accepts connections and
// answers nothing). A resolver whose registry reaches only that member
// reports its view stale (log line, resolver error metric) within the
// watch silence bound instead of staying silently stale; a resolver whose
// registry knows every member moves its watch to a member that answers and
// follows new instances within the same bound.
func TestResolverOnHungMember(t *testing.T) {
	t.Parallel()
	c := etcdtest.StartProcessCluster(t, 3, etcdtest.ProcessClusterOptions{})
	ctx := testContext(t)
	q := beacon.Query{Namespace: "hung", Component: "api", Endpoint: "grpc"}
	b1, b2, b3 := namingtest.Start(t, "b1"), namingtest.Start(t, "b2"), namingtest.Start(t, "b3")
	open := func(endpoints []string) *registry.StoreRegistry {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		st, err := etcd.Open(cctx, etcd.Config{Endpoints: endpoints, WatchSilenceTimeout: silence, ProbeTimeout: 500 * time.Millisecond,
			RequestTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		return newRegistry(t, st, registry.Config{LeaseTTL: 3 * time.Second})
	}
	// A follower: writes go on without an election.
	leader := etcdtest.WaitProcessLeader(t, c, 30*time.Second)
	var hung *etcdproc.Member
	var others []string
	for _, m := range c.Members() {
		if m != leader && hung == nil {
			hung = m
		} else {
			others = append(others, m.ClientURL)
		}
	}
	backends := open(others)
	register(t, backends, q, b1.Addr(), nil)
	register(t, backends, q, b2.Addr(), nil)

	onlyLogs, onlyMetrics := newLogRecorder(), prometheus.NewRegistry()
	only := dial(t, memBuilder(t, open([]string{hung.ClientURL}), naming.WithLogger(slog.New(onlyLogs)), naming.WithMetrics(onlyMetrics)),
		naming.Target(q), "round_robin")
	all := dial(t, memBuilder(t, open(c.Endpoints())), naming.Target(q), "round_robin")
	untilAll(ctx, t, only, "b1", "b2")
	untilAll(ctx, t, all, "b1", "b2")

	if err := hung.Pause(); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	defer func() { _ = hung.Resume() }()
	register(t, backends, q, b3.Addr(), nil)

	untilAll(ctx, t, all, "b1", "b2", "b3")
	t.Logf("the resolver that knows every member followed a new instance %v after the pause", time.Since(paused).Round(time.Millisecond))
	if took := time.Since(paused); took > silenceBound {
		t.Errorf("took %v, bound %v", took, silenceBound)
	}
	onlyLogs.wait(t, 0, "registry watch is stale")
	took := time.Since(paused)
	t.Logf("the resolver that reaches only the stopped member reported stale %v after the pause", took.Round(time.Millisecond))
	if took > silenceBound {
		t.Errorf("took %v, bound %v", took, silenceBound)
	}
	if got := counter(t, onlyMetrics, "beacon_naming_resolver_errors_total", "stale"); got < 1 {
		t.Errorf("stale errors counted: %v", got)
	}
	// Resumed, that resolver catches up.
	if err := hung.Resume(); err != nil {
		t.Fatal(err)
	}
	untilAll(ctx, t, only, "b1", "b2", "b3")
}

const (
	silence = 1500 * time.Millisecond
	// silenceBound: 1.25 silence timeouts, two member probes, the registry's
	// re-list and scheduling slack on a loaded machine.
	silenceBound = silence*5/4 + time.Second + 3*time.Second
)
