package registry

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/memory"
)

// unsureWrites answers the next failing transactions and updates with
// ErrUnavailable, as a client whose member died mid-call does: with landed
// the write was applied before the answer was lost, without it never
// reached the store.
type unsureWrites struct {
	*memory.Store
	failing atomic.Int32
	landed  bool
	calls   atomic.Int32
}

func (s *unsureWrites) fail(ctx context.Context, write func() (int64, error)) (int64, error) {
	s.calls.Add(1)
	if s.failing.Add(-1) < 0 {
		return write()
	}
	if s.landed {
		if _, err := write(); err != nil {
			return 0, err
		}
	}
	return 0, fmt.Errorf("%w: connection reset by peer", store.ErrUnavailable)
}

func (s *unsureWrites) Txn(ctx context.Context, ops ...store.Op) (int64, error) {
	return s.fail(ctx, func() (int64, error) { return s.Store.Txn(ctx, ops...) })
}

func (s *unsureWrites) Update(ctx context.Context, key string, value []byte, modRevision int64, opts ...store.WriteOption) (int64, error) {
	return s.fail(ctx, func() (int64, error) { return s.Store.Update(ctx, key, value, modRevision, opts...) })
}

func newUnsure(t *testing.T, landed bool) (*unsureWrites, *StoreRegistry) {
	t.Helper()
	mem := memory.New(memory.Config{})
	t.Cleanup(func() { _ = mem.Close() })
	st := &unsureWrites{Store: mem, landed: landed}
	r, err := New(st, Config{LeaseTTL: 5 * time.Second, RetryMax: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return st, r
}

// checkHeld fails unless the store holds exactly in's value at its key,
// under r's session lease.
func checkHeld(t *testing.T, st *unsureWrites, r *StoreRegistry, reg Registration) {
	t.Helper()
	rr := reg.(*registration)
	kv, err := st.Store.Get(t.Context(), rr.key)
	if err != nil {
		t.Fatalf("the registration is not in the store: %v", err)
	}
	if kv.Lease != r.Lease() || !bytes.Equal(kv.Value, rr.value()) {
		t.Fatalf("the store holds %q under lease %d; want %q under %d", kv.Value, kv.Lease, rr.value(), r.Lease())
	}
}

// TestRegisterRidesOutAnUnavailableStore: a registration whose transaction
// the store answered with ErrUnavailable — applied or not — is tried again
// and succeeds, once: the instance is registered under the session's
// lease, and nothing removes it afterwards.
func TestRegisterRidesOutAnUnavailableStore(t *testing.T) {
	for _, landed := range []bool{false, true} {
		t.Run(fmt.Sprintf("landed=%v", landed), func(t *testing.T) {
			st, r := newUnsure(t, landed)
			st.failing.Store(2)
			in := beacon.Instance{Namespace: "fo", Component: "c", Endpoint: "e", Address: "10.0.0.1:1"}
			reg, err := r.Register(t.Context(), in)
			if err != nil {
				t.Fatalf("Register across a failover: %v", err)
			}
			checkHeld(t, st, r, reg)
			if n := st.calls.Load(); n < 2 {
				t.Fatalf("%d transactions; want the write tried again", n)
			}
			if err := r.Close(); err != nil { // waits for any cleanup
				t.Fatal(err)
			}
		})
	}
}

// TestRegisterGivesUpOnAStoreThatStaysUnavailable: a store that stays
// unavailable fails the registration with ErrUnavailable once the caller's
// context ends (or a lease TTL passed), after more than one attempt, and
// leaves nothing behind.
func TestRegisterGivesUpOnAStoreThatStaysUnavailable(t *testing.T) {
	st, r := newUnsure(t, false)
	st.failing.Store(1 << 30)
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	_, err := r.Register(ctx, beacon.Instance{Namespace: "fo", Component: "c", Endpoint: "e", Address: "10.0.0.1:1"})
	if !errors.Is(err, store.ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Register on a store that stays unavailable: %v; want ErrUnavailable or the deadline", err)
	}
	if n := st.calls.Load(); n < 2 {
		t.Fatalf("%d attempts; want the write tried again", n)
	}
	kvs, _, err := st.Store.List(t.Context(), beacon.ServicesDir)
	if err != nil || len(kvs) != 0 {
		t.Fatalf("store after the failed registration: %v, %v; want nothing", kvs, err)
	}
}

// TestUpdateRidesOutAnUnavailableStore: an Update whose compare-and-swap
// the store answered with ErrUnavailable — applied or not — is tried again
// and succeeds: the store holds the new value under the session's lease.
func TestUpdateRidesOutAnUnavailableStore(t *testing.T) {
	for _, landed := range []bool{false, true} {
		t.Run(fmt.Sprintf("landed=%v", landed), func(t *testing.T) {
			st, r := newUnsure(t, landed)
			reg, err := r.Register(t.Context(), beacon.Instance{Namespace: "fo", Component: "c", Endpoint: "e", Address: "10.0.0.1:1"})
			if err != nil {
				t.Fatal(err)
			}
			st.failing.Store(2)
			if err := reg.Update(t.Context(), func(in *beacon.Instance) { in.Address = "10.0.0.2:2" }); err != nil {
				t.Fatalf("Update across a failover: %v", err)
			}
			if got := reg.Instance().Address; got != "10.0.0.2:2" {
				t.Fatalf("advertised address %q after the update", got)
			}
			checkHeld(t, st, r, reg)
		})
	}
}

// TestRegisterWithTTLRidesOutAnUnavailableStore: the HTTP API's
// registration (a fresh lease, the instance and its ownership record in one
// transaction) is tried again when the store answered ErrUnavailable —
// applied or not — and succeeds: the instance is held under its lease and
// Heartbeat with the secret works.
func TestRegisterWithTTLRidesOutAnUnavailableStore(t *testing.T) {
	for _, landed := range []bool{false, true} {
		t.Run(fmt.Sprintf("landed=%v", landed), func(t *testing.T) {
			st, r := newUnsure(t, landed)
			st.failing.Store(2)
			o, err := r.RegisterWithTTL(t.Context(), beacon.Instance{Namespace: "fo", Component: "c", Endpoint: "e", Address: "10.0.0.1:1"}, 5*time.Second)
			if err != nil {
				t.Fatalf("RegisterWithTTL across a failover: %v", err)
			}
			kv, err := st.Store.Get(t.Context(), r.ks.Key(o.Instance.Ref()))
			if err != nil || kv.Lease != o.Lease.ID {
				t.Fatalf("instance in the store: %+v, %v; want it under lease %d", kv, err, o.Lease.ID)
			}
			if _, err := r.Heartbeat(t.Context(), o.Instance.Ref(), o.Secret); err != nil {
				t.Fatalf("Heartbeat with the registration's secret: %v", err)
			}
		})
	}
}
