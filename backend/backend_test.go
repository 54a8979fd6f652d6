package backend_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon/backend"
	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/etcd"
	"github.com/beaconplane/beacon/store/file"
	"github.com/beaconplane/beacon/store/memory"
	"github.com/beaconplane/beacon/store/nats"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// clearEnv unsets every variable FromEnv reads, for the test.
func clearEnv(t *testing.T) {
	for _, v := range []string{backend.EnvVar, backend.DynamoEnvVar, etcd.EnvEndpoints, etcd.EnvUsername, etcd.EnvPassword,
		etcd.EnvCA, etcd.EnvClientCert, etcd.EnvClientKey, file.EnvDir, file.EnvHistory, file.EnvHistoryBytes, nats.EnvURL} {
		t.Setenv(v, "")
	}
}

func TestNames(t *testing.T) {
	for _, tc := range []struct {
		cfg  backend.Config
		says []string // parts of the error; none for a valid config
	}{
		{backend.Config{}, nil},
		{backend.Config{Name: backend.Memory}, nil},
		{backend.Config{Name: "zookeeper"}, []string{`backend "zookeeper"`, backend.EnvVar, "use etcd, memory, file or nats"}},
		{backend.Config{Name: "Etcd"}, []string{`backend "Etcd"`, "unknown"}},
		{backend.Config{Name: backend.Kubernetes}, []string{"not linked into this program", backend.KubernetesImport, "use etcd, memory, file or nats"}},
		{backend.Config{Name: backend.File}, []string{file.EnvDir}},
		{backend.Config{Etcd: etcd.Config{Endpoints: []string{"etcd"}}}, []string{`endpoint "etcd"`}},
	} {
		err := tc.cfg.Validate()
		if len(tc.says) == 0 {
			if err != nil {
				t.Errorf("Validate(%q): %v", tc.cfg.Name, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("Validate(%q) accepted %+v", tc.cfg.Name, tc.cfg)
			continue
		}
		for _, s := range tc.says {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("Validate(%q) = %q, which does not say %q", tc.cfg.Name, err, s)
			}
		}
		// Open refuses it the same way, before connecting anywhere.
		if s, oerr := backend.Open(ctxT(t, 5*time.Second), tc.cfg); oerr == nil || oerr.Error() != err.Error() {
			if s != nil {
				s.Close()
			}
			t.Errorf("Open(%q) = %v, want %v", tc.cfg.Name, oerr, err)
		}
	}
	if got := (backend.Config{}).BackendName(); got != backend.Etcd {
		t.Errorf("default backend %q, want %q", got, backend.Etcd)
	}
}

func TestFromEnv(t *testing.T) {
	clearEnv(t)
	if c := backend.FromEnv(); c.BackendName() != backend.Etcd || c.Etcd.Endpoints != nil {
		t.Fatalf("FromEnv with nothing set: %+v", c)
	}
	t.Setenv(backend.EnvVar, " memory ")
	t.Setenv(etcd.EnvEndpoints, "http://a:2379, http://b:2379")
	c := backend.FromEnv()
	if c.BackendName() != backend.Memory || strings.Join(c.Etcd.Endpoints, ",") != "http://a:2379,http://b:2379" {
		t.Fatalf("FromEnv: %+v", c)
	}
	s, err := backend.Open(ctxT(t, 5*time.Second), c)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, ok := s.(*memory.Store); !ok {
		t.Fatalf("backend %q opened a %T", backend.Memory, s)
	}
}

// The default backend is etcd at ETCD_ENDPOINTS: it opens a working store
// against a real server, and an unreachable one fails after the dial
// timeout with an error naming the endpoint, never a hang.
func TestEtcd(t *testing.T) {
	clearEnv(t)
	srv := etcdtest.Start(t, etcdtest.Options{})
	t.Setenv(etcd.EnvEndpoints, strings.Join(srv.Endpoints(), ","))
	s, err := backend.Open(ctxT(t, 10*time.Second), backend.FromEnv())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Put(ctxT(t, 5*time.Second), "/backend/k", []byte("v")); err != nil {
		t.Fatal(err)
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	t.Setenv(etcd.EnvEndpoints, closed)
	cfg := backend.FromEnv()
	cfg.Etcd.DialTimeout = 500 * time.Millisecond
	start := time.Now()
	_, err = backend.Open(ctxT(t, 10*time.Second), cfg)
	took := time.Since(start)
	if !errors.Is(err, store.ErrUnavailable) || !strings.Contains(err.Error(), closed) {
		t.Fatalf("Open of an unreachable etcd: %v", err)
	}
	if took > cfg.Etcd.DialTimeout+2*time.Second {
		t.Fatalf("Open of an unreachable etcd took %v with a %v dial timeout", took, cfg.Etcd.DialTimeout)
	}
	t.Logf("after %v: %v", took.Round(time.Millisecond), err)
}

// DYN_DISCOVERY_BACKEND (Dynamo's selector) is read when
// BEACON_DISCOVERY_BACKEND is unset: every value Dynamo accepts selects
// Beacon's backend of that kind (kv_store, mem and file were refused); any
// other value is refused with an error naming the variable and listing the
// accepted values.
func TestDynamoAlias(t *testing.T) {
	for dyn, want := range map[string]string{
		"kubernetes": backend.Kubernetes, "etcd": backend.Etcd, "kv_store": backend.Etcd,
		"file": backend.File, "mem": backend.Memory,
	} {
		clearEnv(t)
		t.Setenv(backend.DynamoEnvVar, dyn)
		c := backend.FromEnv()
		if got := c.BackendName(); got != want || c.SelectorError() != nil {
			t.Errorf("DYN_DISCOVERY_BACKEND=%s selects %q (%v), want %q", dyn, got, c.SelectorError(), want)
		}
		if got, ok := backend.DynamoName(dyn); !ok || got != want {
			t.Errorf("DynamoName(%q) = %q, %v", dyn, got, ok)
		}
	}
	clearEnv(t)
	t.Setenv(backend.DynamoEnvVar, "kubernetes")
	t.Setenv(backend.EnvVar, "memory")
	if got := backend.FromEnv().BackendName(); got != backend.Memory {
		t.Fatalf("BEACON_DISCOVERY_BACKEND does not win: %q", got)
	}
	t.Setenv(backend.EnvVar, "")
	for _, bad := range []string{"nats", "Etcd", "memory", "kv-store"} {
		t.Setenv(backend.DynamoEnvVar, bad)
		err := backend.FromEnv().Validate()
		if err == nil || !strings.Contains(err.Error(), backend.DynamoEnvVar+`="`+bad+`": unknown; use kubernetes, etcd, kv_store (etcd), file or mem (memory)`) ||
			!strings.Contains(err.Error(), backend.EnvVar) {
			t.Errorf("DYN_DISCOVERY_BACKEND=%s: %v", bad, err)
		}
	}
	// file selects Beacon's file store, which needs its own directory: the
	// error says so rather than letting the user think Dynamo's is read.
	t.Setenv(backend.DynamoEnvVar, "file")
	err := backend.FromEnv().Validate()
	if err == nil || !strings.Contains(err.Error(), file.EnvDir) || !strings.Contains(err.Error(), "not Dynamo's DYN_FILE_KV") {
		t.Fatalf("DYN_DISCOVERY_BACKEND=file without BEACON_FILE_DIR: %v", err)
	}
	t.Setenv(file.EnvDir, t.TempDir())
	if err := backend.FromEnv().Validate(); err != nil {
		t.Fatalf("DYN_DISCOVERY_BACKEND=file with BEACON_FILE_DIR: %v", err)
	}
}

// OpenRegistry opens a registry over a store backend; closing it closes
// the store. A registry backend is not a store.
func TestOpenRegistry(t *testing.T) {
	clearEnv(t)
	r, err := backend.OpenRegistry(ctxT(t, 5*time.Second), backend.Config{Name: backend.Memory}, registry.Config{})
	if err != nil {
		t.Fatal(err)
	}
	sr, ok := r.(*backend.StoreRegistry)
	if !ok {
		t.Fatalf("OpenRegistry(memory) = %T", r)
	}
	if _, ok := r.(registry.LeasedRegistrar); !ok {
		t.Fatal("the store registry lost its LeasedRegistrar capability")
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := sr.Store().Get(ctxT(t, time.Second), "/k"); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("store after Close: %v", err)
	}
	if _, err := backend.OpenRegistry(ctxT(t, time.Second), backend.Config{Name: "zookeeper"}, registry.Config{}); err == nil {
		t.Fatal("OpenRegistry of an unknown backend")
	}
}

// TestMemoryLivesShareNoRevision: the memory store of a process (beacon
// serve --backend memory) and that of its next life share no revision, so
// a watch resuming from a revision of the first is compacted in the second
// (the registry re-lists, an SSE client gets a snapshot). Both started at
// 1: a client resuming from revision 4 after a restart got only the new
// life's changes after its revision 4, kept the old life's instances for
// good and missed the new life's first ones.
func TestMemoryLivesShareNoRevision(t *testing.T) {
	ctx := ctxT(t, 10*time.Second)
	open := func() store.Store {
		st, err := backend.Open(ctx, backend.Config{Name: backend.Memory})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		return st
	}
	first := open()
	var last int64
	for _, k := range []string{"/old/a1", "/old/a2", "/old/a3"} {
		rev, err := first.Put(ctx, k, []byte("v"))
		if err != nil {
			t.Fatal(err)
		}
		last = rev
	}
	second := open()
	for i := range 6 {
		if _, err := second.Put(ctx, fmt.Sprintf("/new/%d", i), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	resp := <-second.Watch(ctx, "/", last+1)
	var ce *store.CompactedError
	if !errors.As(resp.Err, &ce) {
		t.Fatalf("a watch of the second life from revision %d of the first: %+v, want it compacted", last+1, resp)
	}
}
