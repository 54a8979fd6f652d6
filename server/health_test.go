package server

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/backend"
	"github.com/beaconplane/beacon/health"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/memory"
)

// TestHealthChecker: with health checks on, the server's checker
// registers itself with its HTTP address, probes an instance that declares
// a check and writes its verdict; Close takes the verdict away with the
// checker's lease.
func TestHealthChecker(t *testing.T) {
	st := memory.New(memory.Config{})
	t.Cleanup(func() { _ = st.Close() })
	s := startServer(t, Config{HTTPAddr: "127.0.0.1:0", Store: st, Health: HealthConfig{Enabled: true, CheckerID: "node-1"}})
	if s.HealthChecker() == nil || s.HealthChecker().ID() != "node-1" {
		t.Fatal("no health checker node-1 runs")
	}
	target, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	in := beacon.Instance{Namespace: "prod", Component: "api", Endpoint: "tcp", Address: target.Addr().String(),
		Check: &beacon.Check{Kind: beacon.CheckTCP, Interval: beacon.MinCheckInterval}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reg, err := s.Registry().Register(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	key := beacon.Keyspace{}.HealthKey(reg.Instance().Ref())
	awaitValue(ctx, t, st, key, func(v []byte) bool {
		var h beacon.Health
		return json.Unmarshal(v, &h) == nil && h.Status == beacon.HealthPassing && h.Checker == "node-1"
	})
	checkers, _, err := s.Registry().List(ctx, health.CheckersQuery)
	if err != nil {
		t.Fatal(err)
	}
	if len(checkers) != 1 || checkers[0].Address != strings.TrimPrefix(s.Endpoints().HTTP, "http://") ||
		checkers[0].Metadata[health.CheckerIDMetadata] != "node-1" {
		t.Fatalf("the checkers registered: %+v, want node-1 at the HTTP address %s", checkers, s.Endpoints().HTTP)
	}
	if _, body := get(t, s.Endpoints().HTTP+"/metrics"); !strings.Contains(body, "beacon_health_owned_instances 1") {
		t.Fatal("/metrics does not say the checker owns one instance")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Get(ctx, key); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the verdict outlived the server's checker: %v", err)
	}
}

// awaitValue waits until key holds a value ok accepts.
func awaitValue(ctx context.Context, t *testing.T, st store.Store, key string, ok func([]byte) bool) {
	t.Helper()
	kv, err := st.Get(ctx, key)
	if err == nil && ok(kv.Value) {
		return
	}
	_, rev, err := st.List(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if kv, err := st.Get(ctx, key); err == nil && ok(kv.Value) {
		return
	}
	for resp := range st.Watch(ctx, key, rev+1) {
		for _, e := range resp.Events {
			if e.Type == store.EventPut && ok(e.KV.Value) {
				return
			}
		}
	}
	t.Fatalf("no such value at %s: %v", key, ctx.Err())
}

// TestHealthConfig: health checks are refused over the dynamo layout (a
// read-only view), and a bad checker ID or address is named (the
// kubernetes backend's, cmd/beacon's TestHealthFlags).
func TestHealthConfig(t *testing.T) {
	for want, cfg := range map[string]Config{
		"Config.Health.Enabled":   {Registry: registry.Config{Layout: registry.LayoutDynamo}, Health: HealthConfig{Enabled: true}},
		"Config.Health.CheckerID": {Health: HealthConfig{Enabled: true, CheckerID: "node 1"}},
		"Config.Health.Addr":      {Health: HealthConfig{Enabled: true, Addr: "no port"}},
	} {
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("want an error naming %s, got %v", want, err)
		}
	}
	if err := (Config{Health: HealthConfig{Enabled: true, Addr: "10.1.2.3:9379"}}).Validate(); err != nil {
		t.Fatal(err)
	}
}

// TestHealthCheckerID: the checker is named after the embedded etcd
// member, else the host.
func TestHealthCheckerID(t *testing.T) {
	host, err := os.Hostname()
	if err != nil {
		t.Skip("no host name:", err)
	}
	for want, cfg := range map[string]Config{
		"node-7": {Name: "node-7"},
		host:     {Backend: backend.Config{Name: backend.Memory}},
		"given":  {Name: "node-7", Health: HealthConfig{CheckerID: "given"}},
	} {
		s := &Server{cfg: cfg.withDefaults()}
		if got, err := s.checkerID(); err != nil || got != want {
			t.Errorf("checker ID %q (%v), want %q", got, err, want)
		}
	}
}
