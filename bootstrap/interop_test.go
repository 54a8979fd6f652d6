package bootstrap_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/beaconplane/beacon/bootstrap"
	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3discovery"
	"go.uber.org/zap"
)

// startMembers starts etcd 3.7 members concurrently (a discovery member is
// ready only once its token is full) and returns them in order, failing
// the test if any does not start.
func startMembers(t *testing.T, names []string, configure func(name string) func(*embed.Config)) []*etcdtest.Server {
	t.Helper()
	servers := make([]*etcdtest.Server, len(names))
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			servers[i], errs[i] = etcdtest.New(etcdtest.Options{Name: name, Configure: configure(name)})
		}()
	}
	wg.Wait()
	for _, s := range servers {
		if s != nil {
			t.Cleanup(s.Close)
		}
	}
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("start members: %v", err)
	}
	return servers
}

// memberList returns "name=peerURL" of every member, sorted, and checks
// that all have started.
func memberList(t *testing.T, ctx context.Context, s *etcdtest.Server) (map[uint64]string, []string) {
	t.Helper()
	cli := client(t, s)
	ml, err := cli.MemberList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	byID := map[uint64]string{}
	var pairs []string
	for _, m := range ml.Members {
		if m.Name == "" || m.IsLearner {
			t.Fatalf("member %x not started: %v", m.ID, m)
		}
		byID[m.ID] = m.Name + "=" + m.PeerURLs[0]
		pairs = append(pairs, byID[m.ID])
	}
	sort.Strings(pairs)
	return byID, pairs
}

// Real etcd 3.7 members (embed.Config with its discovery settings)
// bootstrap a healthy cluster through a registry whose token Beacon
// created; a fourth member is refused with etcd's "cluster is full"; and
// Beacon's client reads the registry they wrote exactly as etcd's own
// GetCluster does.
func TestEtcdMembersBootstrapThroughBeaconToken(t *testing.T) {
	registry := registryServer(t)
	tok, cli := createToken(t, 3)
	ctx := testCtx(t, 60*time.Second)

	members := startMembers(t, []string{"infra1", "infra2", "infra3"}, func(string) func(*embed.Config) {
		return etcdtest.WithDiscovery(tok, registry.Endpoints())
	})
	byID, pairs := memberList(t, ctx, members[0])
	if len(byID) != 3 {
		t.Fatalf("cluster of %d members", len(byID))
	}
	if _, err := client(t, members[1]).Put(ctx, "hello", "world"); err != nil {
		t.Fatalf("write to the new cluster: %v", err)
	}

	// (b) Beacon reads what etcd wrote: same keys, same IDs, and the same
	// initial cluster string as etcd's own v3discovery.GetCluster.
	st, err := bootstrap.TokenStatus(ctx, cli, tok)
	if err != nil || st.State != bootstrap.StateFull || len(st.Members) != 3 {
		t.Fatalf("status: %+v, %v", st, err)
	}
	for _, m := range st.Members {
		id, err := bootstrap.ParseID(m.ID)
		if err != nil || byID[id] != m.Value {
			t.Fatalf("registration %s=%s is not member %x of the cluster (%v)", m.Key, m.Value, id, byID)
		}
	}
	got, err := bootstrap.GetCluster(ctx, config(registry, tok))
	if err != nil {
		t.Fatal(err)
	}
	dcfg := &v3discovery.DiscoveryConfig{Token: tok}
	dcfg.Endpoints = registry.Endpoints()
	dcfg.DialTimeout, dcfg.RequestTimeout = 5*time.Second, 5*time.Second
	want, err := v3discovery.GetCluster(zap.NewNop(), dcfg)
	if err != nil {
		t.Fatal(err)
	}
	if got.InitialCluster != want {
		t.Fatalf("Beacon reads %q, etcd reads %q", got.InitialCluster, want)
	}
	split := strings.Split(got.InitialCluster, ",")
	sort.Strings(split)
	if strings.Join(split, ",") != strings.Join(pairs, ",") {
		t.Fatalf("initial cluster %q is not the cluster %v", got.InitialCluster, pairs)
	}

	// (a) A fourth etcd member is refused.
	_, err = etcdtest.New(etcdtest.Options{Name: "infra4", Configure: etcdtest.WithDiscovery(tok, registry.Endpoints())})
	if err == nil || !strings.Contains(err.Error(), "discovery: cluster is full") {
		t.Fatalf("fourth etcd member: %v", err)
	}
	// And so is a fourth Beacon member, with the same message.
	if _, err := bootstrap.Join(ctx, config(registry, tok), "infra4", []string{peerURL(9)}); !errors.Is(err, bootstrap.ErrFullCluster) {
		t.Fatalf("fourth Beacon member: %v", err)
	}
}

// A member that bootstraps with Beacon's Join (as beacon serve does) and
// two real etcd members share one token and form one cluster: the member
// IDs etcd computes from Join's answer are the IDs everyone registered.
func TestBeaconJoinAndEtcdMembersFormOneCluster(t *testing.T) {
	registry := registryServer(t)
	tok, _ := createToken(t, 3)
	ctx := testCtx(t, 60*time.Second)
	members := startMembers(t, []string{"etcd-a", "beacon-b", "etcd-c"}, func(name string) func(*embed.Config) {
		if !strings.HasPrefix(name, "beacon") {
			return etcdtest.WithDiscovery(tok, registry.Endpoints())
		}
		return func(cfg *embed.Config) {
			c, err := bootstrap.Join(ctx, config(registry, tok), cfg.Name, []string{cfg.AdvertisePeerUrls[0].String()})
			if err != nil {
				t.Errorf("join: %v", err) // the start then fails and reports too
				return
			}
			cfg.InitialCluster, cfg.InitialClusterToken = c.InitialCluster, c.Token
		}
	})
	byID, _ := memberList(t, ctx, members[1])
	if len(byID) != 3 {
		t.Fatalf("cluster: %v", byID)
	}
	for _, s := range members {
		if got, _ := memberList(t, ctx, s); fmt.Sprint(got) != fmt.Sprint(byID) {
			t.Fatalf("members disagree: %v vs %v", got, byID)
		}
	}
	cli := client(t, members[2])
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	resp, err := client(t, members[1]).Get(ctx, "k")
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("read back through the Beacon-joined member: %v, %v", resp, err)
	}
}
