package dnsapi

import (
	"context"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/etcdtest"
	"github.com/beaconplane/beacon/internal/natstest"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/etcd"
	"github.com/beaconplane/beacon/store/file"
	"github.com/beaconplane/beacon/store/memory"
	bnats "github.com/beaconplane/beacon/store/nats"
	"github.com/miekg/dns"
)

// DNS works over every store backend: an instance registered by one
// registry (another process, for the shared backends) is answered by a DNS
// server over another, and gone once deregistered.
func TestEveryBackend(t *testing.T) {
	t.Parallel()
	open := func(t *testing.T, f func(ctx context.Context) (store.Store, error)) registry.Registry {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
		defer cancel()
		st, err := f(ctx)
		if err != nil {
			t.Fatal(err)
		}
		r, err := registry.New(st, registry.Config{LeaseTTL: registry.MinLeaseTTL})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = r.Close()
			_ = st.Close()
		})
		return r
	}
	mem := memory.New(memory.Options{})
	t.Cleanup(func() { _ = mem.Close() })
	for _, b := range []struct {
		name string
		// stores returns how to open a store of the backend; each call
		// is a separate client (process) of the same data.
		stores func(t *testing.T) func(ctx context.Context) (store.Store, error)
	}{
		{"memory", func(*testing.T) func(context.Context) (store.Store, error) {
			return func(context.Context) (store.Store, error) { return mem, nil }
		}},
		{"etcd", func(t *testing.T) func(context.Context) (store.Store, error) {
			e := etcdtest.Start(t, etcdtest.Options{})
			return func(ctx context.Context) (store.Store, error) {
				return etcd.New(ctx, etcd.Config{Endpoints: e.Endpoints()})
			}
		}},
		{"file", func(t *testing.T) func(context.Context) (store.Store, error) {
			dir := t.TempDir()
			return func(ctx context.Context) (store.Store, error) { return file.Open(ctx, file.Config{Dir: dir}) }
		}},
		{"nats", func(t *testing.T) func(context.Context) (store.Store, error) {
			srv := natstest.Start(t, natstest.Options{})
			return func(ctx context.Context) (store.Store, error) {
				return bnats.Open(ctx, bnats.Config{URL: srv.ClientURL()})
			}
		}},
	} {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			stores := b.stores(t)
			server, registrant := open(t, stores), open(t, stores)
			s, addr := startDNS(t, server, Config{})
			reg := register(t, registrant, testInstance("web", "10.0.0.1:80"))
			name := reg.Instance().ID + ".web.api.prod.beacon."
			waitView(t, s, "the instance", func() bool { return query(t, addr, "udp", name, dns.TypeA, 0).Rcode == dns.RcodeSuccess })
			if got := dig(t, addr, "web.api.prod.beacon.", "SRV").rdata("SRV"); len(got) != 1 {
				t.Errorf("SRV = %v", got)
			}
			start := time.Now()
			if err := reg.Close(); err != nil {
				t.Fatal(err)
			}
			waitView(t, s, "the instance to go", func() bool { return query(t, addr, "udp", name, dns.TypeA, 0).Rcode == dns.RcodeNameError })
			t.Logf("%s: deregistration -> NXDOMAIN in %v", b.name, time.Since(start).Round(time.Millisecond))
		})
	}
}
