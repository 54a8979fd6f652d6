package registry_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store"
)

// TestOwnershipCannotBeHijacked tries every way of taking over a
// registration made for a remote client without its secret, on every
// backend: guessed secrets, the lease ID in place of the secret, another
// registration's secret, a secret replayed after the ID was registered
// again, and the instances of a session (Go library, `beacon register`).
// Each attempt gets exactly the answer an unknown instance gets, and
// changes nothing.
func TestOwnershipCannotBeHijacked(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			st := b.store(t)
			r := newRegistry(t, st, registry.Config{LeaseTTL: b.ttl})
			ns := uniqueNS()
			ctx := within(t, 60*time.Second)

			victim, err := r.RegisterWithTTL(ctx, inst(ns, "10.0.0.1:80"), time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			other, err := r.RegisterWithTTL(ctx, inst(ns, "10.0.0.2:80"), time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			session, err := r.Register(ctx, inst(ns, "10.0.0.3:80"))
			if err != nil {
				t.Fatal(err)
			}
			sessionLease := r.Lease()
			unknown := beacon.Ref{Namespace: ns, Component: "api", Endpoint: "http", ID: beacon.NewID()}
			_, missing := r.Heartbeat(ctx, unknown, victim.Secret)
			if !errors.Is(missing, beacon.ErrNotFound) {
				t.Fatalf("heartbeat of an unknown instance: %v", missing)
			}
			// The answer for ref, if ref were unknown.
			wantErr := func(ref beacon.Ref) string {
				return strings.Replace(missing.Error(), unknown.String(), ref.String(), 1)
			}

			var guesses []registry.Secret
			for range 50 {
				guesses = append(guesses, registry.NewSecret())
			}
			// Lease IDs (the old credential), in every spelling.
			for _, l := range []store.LeaseID{victim.Lease.ID, sessionLease, victim.Lease.ID + 1, victim.Lease.ID - 1} {
				guesses = append(guesses, registry.Secret(strconv.FormatInt(int64(l), 16)), registry.Secret(strconv.FormatInt(int64(l), 10)))
			}
			guesses = append(guesses, "", other.Secret, victim.Secret[:len(victim.Secret)-1], victim.Secret+"A",
				registry.Secret(strings.ToUpper(string(victim.Secret))))

			for _, target := range []beacon.Ref{victim.Instance.Ref(), session.Instance().Ref()} {
				for _, g := range guesses {
					if g == victim.Secret && target == victim.Instance.Ref() {
						continue
					}
					_, err := r.Heartbeat(ctx, target, g)
					if err == nil || err.Error() != wantErr(target) {
						t.Fatalf("heartbeat of %s with a guessed secret: %v, want %q", target, err, wantErr(target))
					}
					_, err = r.UpdateLeased(ctx, target, g, func(in *beacon.Instance) { in.Address = "10.6.6.6:80" })
					if err == nil || err.Error() != wantErr(target) {
						t.Fatalf("update of %s with a guessed secret: %v", target, err)
					}
					if err := r.DeregisterLeased(ctx, target, g); err == nil || err.Error() != wantErr(target) {
						t.Fatalf("deregister of %s with a guessed secret: %v", target, err)
					}
				}
			}
			// Nothing changed: both still there, unchanged, the session's
			// lease alive.
			for _, want := range []beacon.Instance{victim.Instance, session.Instance()} {
				got, err := r.Get(ctx, want.Ref())
				if err != nil || got.Address != want.Address {
					t.Fatalf("after the attempts %s = %+v, %v; want address %s", want.Ref(), got, err, want.Address)
				}
			}
			if r.State() != registry.StateActive || r.Lease() != sessionLease {
				t.Fatalf("session state %v lease %x, want active on %x", r.State(), r.Lease(), sessionLease)
			}

			// The owner's secret works; a replay after re-registration
			// under the same ID does not.
			if _, err := r.Heartbeat(ctx, victim.Instance.Ref(), victim.Secret); err != nil {
				t.Fatal(err)
			}
			if err := r.DeregisterLeased(ctx, victim.Instance.Ref(), victim.Secret); err != nil {
				t.Fatal(err)
			}
			again := inst(ns, "10.0.0.9:80")
			again.ID = victim.Instance.ID
			renewed, err := r.RegisterWithTTL(ctx, again, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := r.Heartbeat(ctx, again.Ref(), victim.Secret); err == nil || err.Error() != wantErr(again.Ref()) {
				t.Fatalf("replayed secret of the previous registration: %v", err)
			}
			if _, err := r.Heartbeat(ctx, again.Ref(), renewed.Secret); err != nil {
				t.Fatal(err)
			}

			// A duplicate ID is refused without naming the holder's lease.
			dup := inst(ns, "10.0.0.4:80")
			dup.ID = other.Instance.ID
			_, err = r.RegisterWithTTL(ctx, dup, time.Minute)
			if !errors.Is(err, beacon.ErrAlreadyRegistered) {
				t.Fatalf("duplicate: %v", err)
			}
			if strings.Contains(err.Error(), "lease") {
				t.Fatalf("duplicate error %q speaks of the holder's lease", err)
			}
			for _, l := range []store.LeaseID{other.Lease.ID, sessionLease} {
				if hexForm := strconv.FormatInt(int64(l), 16); len(hexForm) > 4 && strings.Contains(err.Error(), hexForm) {
					t.Fatalf("duplicate error %q reveals lease %s", err, hexForm)
				}
			}
		})
	}
}

// TestOwnershipRecords: the records live beside the instances, bound to
// their leases, never listed as instances, and go with the lease.
func TestOwnershipRecords(t *testing.T) {
	st := newMemoryStore(t)
	r := newRegistry(t, st, registry.Config{})
	ns := uniqueNS()
	ctx := within(t, 30*time.Second)
	o, err := r.RegisterWithTTL(ctx, inst(ns, "10.0.0.1:80"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	prefix := r.Keyspace().OwnersPrefix(ns)
	kvs, _, err := st.List(ctx, prefix)
	if err != nil || len(kvs) != 1 || kvs[0].Lease != o.Lease.ID {
		t.Fatalf("ownership records under %s: %+v, %v", prefix, kvs, err)
	}
	if strings.Contains(string(kvs[0].Value), string(o.Secret)) {
		t.Fatalf("the record stores the secret itself: %s", kvs[0].Value)
	}
	list, _, err := r.List(ctx, beacon.Query{})
	if err != nil || len(list) != 1 {
		t.Fatalf("List = %+v, %v: want the instance alone", list, err)
	}
	// Expiry takes the record with the instance.
	w := st.Watch(ctx, prefix, 0)
	for {
		select {
		case resp := <-w:
			if resp.Err != nil {
				t.Fatal(resp.Err)
			}
			for _, e := range resp.Events {
				if e.Type == store.EventDelete {
					if _, err := r.Get(ctx, o.Instance.Ref()); !errors.Is(err, beacon.ErrNotFound) {
						t.Fatalf("record gone but instance %v", err)
					}
					return
				}
			}
		case <-ctx.Done():
			t.Fatal("ownership record not deleted with its lease")
		}
	}
}

// ownerReads is a store that counts the reads of ownership records under
// prefix (every backend used here has transactions).
type ownerReads struct {
	store.Store
	prefix string
	n      atomic.Int32
}

func (o *ownerReads) count(key string) {
	if strings.HasPrefix(key, o.prefix) {
		o.n.Add(1)
	}
}

func (o *ownerReads) Get(ctx context.Context, key string) (store.KeyValue, error) {
	o.count(key)
	return o.Store.Get(ctx, key)
}

func (o *ownerReads) GetLocal(ctx context.Context, key string) (store.KeyValue, error) {
	o.count(key)
	if lr, ok := o.Store.(store.LocalReader); ok {
		return lr.GetLocal(ctx, key)
	}
	return o.Store.Get(ctx, key)
}

func (o *ownerReads) Txn(ctx context.Context, ops ...store.Op) (int64, error) {
	return o.Store.(store.Transactor).Txn(ctx, ops...)
}

// TestHeartbeatOfAProvenOwner: once a registry has proven a secret its
// registration's (registering it, or a heartbeat checked against the
// ownership record), its heartbeats read no ownership record — one round
// trip to the store, the instance read while the lease is renewed — and
// still answer not found for an instance deleted under a live lease
// (etcdctl del) and for one registered again by someone else. A registry
// that has not seen the registration (a restarted server) proves the
// secret against the store once.
func TestHeartbeatOfAProvenOwner(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			ns := uniqueNS()
			inner := b.store(t)
			st := &ownerReads{Store: inner}
			r := newRegistry(t, st, registry.Config{LeaseTTL: b.ttl})
			st.prefix = r.Keyspace().OwnersPrefix(ns)
			ctx := within(t, 60*time.Second)
			o, err := r.RegisterWithTTL(ctx, inst(ns, "10.0.0.1:80"), time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			ref := o.Instance.Ref()
			heartbeats := func(r *registry.StoreRegistry, n int) {
				t.Helper()
				for range n {
					if _, err := r.Heartbeat(ctx, ref, o.Secret); err != nil {
						t.Fatal(err)
					}
				}
			}
			heartbeats(r, 3)
			if got := st.n.Load(); got != 0 {
				t.Fatalf("3 heartbeats of the registering registry read the ownership record %d times; want 0", got)
			}

			// A restarted server: proven once against the store.
			restarted := newRegistry(t, st, registry.Config{LeaseTTL: b.ttl})
			heartbeats(restarted, 3)
			if got := st.n.Load(); got != 1 {
				t.Fatalf("3 heartbeats through a registry that had not seen the registration read the record %d times; want 1", got)
			}

			// Deleted under its live lease: not found, for both.
			if _, err := inner.Delete(ctx, r.Keyspace().Key(ref)); err != nil {
				t.Fatal(err)
			}
			for _, reg := range []*registry.StoreRegistry{r, restarted} {
				if _, err := reg.Heartbeat(ctx, ref, o.Secret); !errors.Is(err, beacon.ErrNotFound) {
					t.Fatalf("heartbeat of an instance deleted under its live lease: %v; want not found", err)
				}
			}

			// Registered again by someone else under the same ID: the old
			// secret is refused, the new one works.
			again := inst(ns, "10.0.0.9:80")
			again.ID = o.Instance.ID
			other, err := newRegistry(t, inner, registry.Config{LeaseTTL: b.ttl}).RegisterWithTTL(ctx, again, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			for _, reg := range []*registry.StoreRegistry{r, restarted} {
				if _, err := reg.Heartbeat(ctx, ref, o.Secret); !errors.Is(err, beacon.ErrNotFound) {
					t.Fatalf("heartbeat with the secret of the registration before: %v; want not found", err)
				}
				if _, err := reg.Heartbeat(ctx, ref, other.Secret); err != nil {
					t.Fatalf("heartbeat with the new registration's secret: %v", err)
				}
			}
		})
	}
}
