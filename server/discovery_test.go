package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/beaconplane/beacon/bootstrap"
	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"github.com/beaconplane/beacon/internal/testkit/testpeer"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// createToken makes a v3 discovery token in a server's embedded etcd.
func createToken(t *testing.T, registry *Server, size int) bootstrap.CreateTokenResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tok := bootstrap.NewToken()
	if _, err := bootstrap.CreateToken(ctx, registry.EtcdClient(), tok, size); err != nil {
		t.Fatal(err)
	}
	eps := registry.Endpoints().ClientURLs
	return bootstrap.CreateTokenResponse{Token: tok, Size: size, Endpoints: eps, Flags: bootstrap.MemberFlags(tok, eps)}
}

// discoveryConfig is a server config that joins the token.
func discoveryConfig(t *testing.T, name string, created bootstrap.CreateTokenResponse) Config {
	cfg := testConfig(t)
	cfg.Name = name
	cfg.Discovery.Token = created.Token
	cfg.Discovery.Endpoints = created.Endpoints
	cfg.Discovery.Timeout = 60 * time.Second
	return cfg
}

// startServers starts servers concurrently (members of a discovery token
// are ready only once all have joined).
func startServers(t *testing.T, cfgs ...Config) []*Server {
	t.Helper()
	servers := make([]*Server, len(cfgs))
	errs := make([]error, len(cfgs))
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for i, cfg := range cfgs {
		s, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		servers[i] = s
		t.Cleanup(func() { _ = s.Close() })
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = s.Start(ctx)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return servers
}

// Three `beacon serve` nodes form one 3-member embedded etcd cluster
// through a token made on a fourth; a late node is refused (exit) or
// serves as a proxy of the cluster (proxy); a restarted node comes back
// from its data without the token.
func TestServersBootstrapThroughDiscoveryToken(t *testing.T) {
	registry := startServer(t, testConfig(t))
	created := createToken(t, registry, 3)
	cfgs := []Config{
		discoveryConfig(t, "b1", created), discoveryConfig(t, "b2", created), discoveryConfig(t, "b3", created),
	}
	servers := startServers(t, cfgs...)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	for _, s := range servers {
		ml, err := s.EtcdClient().MemberList(ctx)
		if err != nil || len(ml.Members) != 3 {
			t.Fatalf("%s: members %v, %v", s.cfg.Name, ml, err)
		}
	}
	if _, err := servers[0].Store().Put(ctx, "/hello", []byte("cluster")); err != nil {
		t.Fatal(err)
	}
	if kv, err := servers[2].Store().Get(ctx, "/hello"); err != nil || string(kv.Value) != "cluster" {
		t.Fatalf("read on another member: %q, %v", kv.Value, err)
	}
	st, err := bootstrap.TokenStatus(ctx, registry.EtcdClient(), created.Token)
	if err != nil || st.State != bootstrap.StateFull {
		t.Fatalf("token status: %+v, %v", st, err)
	}

	// A fourth node with --discovery-fallback=exit (the default) is refused.
	late, err := New(discoveryConfig(t, "b4", created))
	if err != nil {
		t.Fatal(err)
	}
	if err := late.Start(ctx); !errors.Is(err, bootstrap.ErrFullCluster) || !strings.Contains(err.Error(), "discovery: cluster is full") {
		t.Fatalf("late node: %v", err)
	}

	// With --discovery-fallback=proxy it serves the cluster as a proxy.
	pcfg := discoveryConfig(t, "b5", created)
	pcfg.Discovery.Fallback = FallbackProxy
	px := startServer(t, pcfg)
	if !strings.Contains(px.Banner(), "proxy") {
		t.Fatalf("proxy banner:\n%s", px.Banner())
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: pcfg.ListenClientURLs, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	resp, err := cli.Get(ctx, "/hello")
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "cluster" {
		t.Fatalf("read through the fallback proxy: %v, %v", resp, err)
	}
	if kv, err := px.Store().Get(ctx, "/hello"); err != nil || string(kv.Value) != "cluster" {
		t.Fatalf("the proxy node's store: %q, %v", kv.Value, err)
	}
	// It is a readwrite proxy: writes reach the cluster.
	if _, err := cli.Put(ctx, "/via-proxy", "written"); err != nil {
		t.Fatalf("write through the fallback proxy: %v", err)
	}
	if kv, err := servers[0].Store().Get(ctx, "/via-proxy"); err != nil || string(kv.Value) != "written" {
		t.Fatalf("the cluster after a write through the fallback proxy: %q, %v", kv.Value, err)
	}
	// The proxy node's token API works on the cluster through the proxy.
	resp2, err := http.Post(px.Endpoints().HTTP+"/v1/tokens", "application/json", strings.NewReader(`{"size":5}`))
	if err != nil {
		t.Fatal(err)
	}
	var made bootstrap.CreateTokenResponse
	if err := json.NewDecoder(resp2.Body).Decode(&made); err != nil || resp2.StatusCode != http.StatusCreated {
		t.Fatalf("token created on the proxy node: %d %+v %v", resp2.StatusCode, made, err)
	}
	resp2.Body.Close()
	if st, err := bootstrap.TokenStatus(ctx, servers[0].EtcdClient(), made.Token); err != nil || st.Size != 5 {
		t.Fatalf("token made through the proxy node, read on the cluster: %+v, %v", st, err)
	}
	if err := px.Close(); err != nil {
		t.Fatal(err)
	}

	// A restarted member starts from its data; the token is not read
	// again (the registry may even be gone).
	if err := servers[1].Close(); err != nil {
		t.Fatal(err)
	}
	if err := registry.Close(); err != nil {
		t.Fatal(err)
	}
	again := startServer(t, cfgs[1])
	if kv, err := again.Store().Get(ctx, "/hello"); err != nil || string(kv.Value) != "cluster" {
		t.Fatalf("restarted member: %q, %v", kv.Value, err)
	}

	// A member removed from the cluster stops, saying so and what to do
	// (etcd itself only logs a warning; Beacon said "embedded etcd
	// stopped"), and so does its next start with the old data.
	id := again.member.etcd.Server.MemberID()
	// etcd refuses to remove a member until the others have been
	// connected for 5 s (ErrUnhealthy): there is no event to wait on.
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		_, err := servers[0].EtcdClient().MemberRemove(ctx, uint64(id))
		if err == nil {
			break
		}
		if !errors.Is(err, rpctypes.ErrUnhealthy) {
			t.Fatal(err)
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("member remove: %v", err)
		}
	}
	want := []string{"this member (b2, ID " + id.String() + ") was removed from its cluster", "remove Config.DataDir " + cfgs[1].DataDir, "Config.InitialClusterState existing and Config.InitialCluster set to the list member add prints"}
	check := func(what string, err error) {
		t.Helper()
		for _, w := range want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Fatalf("%s: %v, want it to say %q", what, err, w)
			}
		}
	}
	check("the removed member", again.Wait(ctx))
	restarted, err := New(cfgs[1])
	if err != nil {
		t.Fatal(err)
	}
	check("the removed member started again", restarted.Start(ctx))
	_ = restarted.Close()
	if _, err := os.Stat(filepath.Join(cfgs[1].DataDir, "member")); err != nil {
		t.Fatalf("the removed member's data is the operator's to remove, not a failed first start's: %v", err)
	}
}

func TestDiscoveryConfigErrors(t *testing.T) {
	base := func() Config {
		c := testConfig(t)
		c.Discovery.Token, c.Discovery.Endpoints = "tok", []string{"http://127.0.0.1:2379"}
		return c
	}
	for name, tc := range map[string]struct {
		mut  func(*Config)
		want string
	}{
		"token only":      {func(c *Config) { c.Discovery.Endpoints = nil }, "both Config.Discovery.Token and Config.Discovery.Endpoints"},
		"endpoints only":  {func(c *Config) { c.Discovery.Token = "" }, "both Config.Discovery.Token and Config.Discovery.Endpoints"},
		"initial cluster": {func(c *Config) { c.InitialCluster = "a=http://127.0.0.1:1" }, "Config.InitialCluster and Config.Discovery.Token"},
		"external etcd":   {func(c *Config) { c.EtcdEndpoints = []string{"http://127.0.0.1:1"} }, "embedded etcd"},
		"existing":        {func(c *Config) { c.InitialClusterState = "existing" }, "must be new"},
		"fallback":        {func(c *Config) { c.Discovery.Fallback = "retry" }, "Config.Discovery.Fallback"},
		"bad token":       {func(c *Config) { c.Discovery.Token = "a/b" }, "invalid token"},
	} {
		c := base()
		tc.mut(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
	}
	if err := base().Validate(); err != nil {
		t.Fatal(err)
	}
}

// Three Debian etcd 3.4 members bootstrap a cluster with
// --discovery=<beacon serve>/v2/discovery/<token>; a fourth is told the
// cluster is full.
func TestEtcd34MembersBootstrapThroughServerV2Discovery(t *testing.T) {
	bin := testpeer.Binary(t, "apt-get install -y etcd-server (Debian's etcd 3.4, which still speaks v2 discovery)", "/usr/bin/etcd", "etcd")
	s := startServer(t, testConfig(t))
	code, durl := get(t, s.Endpoints().HTTP+V2Path+"/new?size=3")
	if code != 200 || !strings.HasPrefix(durl, s.Endpoints().HTTP+V2Path+"/") {
		t.Fatalf("/new: %d %q", code, durl)
	}
	args := []string{"--discovery", durl, "--discovery-fallback", "exit", "--logger", "zap", "--log-level", "warn"}
	var members []*etcdtest.Process
	for i := 1; i <= 3; i++ {
		members = append(members, etcdtest.StartProcess(t, bin, fmt.Sprintf("e%d", i), args...))
	}
	deadline := time.Now().Add(45 * time.Second)
	for _, m := range members {
		m.WaitHealthy(t, deadline)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{members[2].ClientURL}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ml, err := cli.MemberList(ctx)
	if err != nil || len(ml.Members) != 3 {
		t.Fatalf("member list: %v, %v", ml, err)
	}
	late := etcdtest.StartProcess(t, bin, "e4", args...)
	select {
	case <-late.Exited():
		if late.Err() == nil || !strings.Contains(late.Output(), "discovery: cluster is full") {
			t.Fatalf("fourth member: exit %v, output:\n%s", late.Err(), late.Output())
		}
	case <-ctx.Done():
		t.Fatal("fourth member did not exit")
	}
}

// A member waiting for its discovery peers already answers /healthz (so an
// orchestrator does not kill it) and says it is starting on /readyz.
func TestHealthzWhileWaitingForPeers(t *testing.T) {
	reg := startServer(t, testConfig(t))
	created := createToken(t, reg, 2)
	cfg := discoveryConfig(t, "m1", created)
	port, err := etcdtest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	cfg.HTTPAddr = fmt.Sprintf("127.0.0.1:%d", port)
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan error, 1)
	go func() { started <- s.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-started
		_ = s.Close()
	})
	base := "http://" + cfg.HTTPAddr
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(base + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("/healthz while waiting = %d", resp.StatusCode)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/healthz never answered: %v", err)
		}
		select {
		case err := <-started:
			t.Fatalf("Start returned %v while one of two members was missing", err)
		case <-time.After(20 * time.Millisecond): // the listener has no event to wait on
		}
	}
	if code, body := get(t, base+"/readyz"); code != 503 || !strings.Contains(body, "starting") {
		t.Fatalf("/readyz while waiting = %d %s", code, body)
	}
}
