// Package healthtest puts checked instances, with the checkers' verdict on
// them, into a store, for the tests of the registry's consumers (xDS, DNS,
// the resolver, pickers, the HTTP API, the dashboard, the CLI): every
// reader of a registry over that store then sees the instance with the
// Health the test chose, without a checker running.
//
// Put writes the verdict where the checkers write it: at its own key
// beside the instance (Keyspace.HealthKey), which the registry's view
// joins to the instance. Panic is not a stored fact but the view's verdict
// on a priority level of a service: a test that sets it must also make
// more than the registry's panic threshold
// (registry.Config.HealthPanicThreshold, half by default) of the level's
// checked instances failing, with no other priority taking work.
package healthtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/memory"
)

// Checker is the checker every verdict made here names.
const Checker = "healthtest"

// Since is when every verdict made here was reached.
var Since = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

// Check is the check Unknown, Passing, Failing and Panic declare on an
// instance that declares none.
var Check = beacon.Check{Kind: beacon.CheckTCP}

// Unchecked returns in without a check or a verdict.
func Unchecked(in beacon.Instance) beacon.Instance {
	in.Check, in.Health = nil, nil
	return in
}

// Unknown returns in declaring a check that has no verdict yet.
func Unknown(in beacon.Instance) beacon.Instance {
	return with(in, beacon.Health{Status: beacon.HealthUnknown})
}

// Passing returns in declaring a check that passes.
func Passing(in beacon.Instance) beacon.Instance {
	return with(in, beacon.Health{Status: beacon.HealthPassing, Since: Since, Checker: Checker})
}

// Failing returns in declaring a check that fails for reason.
func Failing(in beacon.Instance, reason string) beacon.Instance {
	return with(in, beacon.Health{Status: beacon.HealthFailing, Reason: reason, Since: Since, Checker: Checker})
}

// Panic returns in failing for reason at a priority level in panic: served
// anyway.
func Panic(in beacon.Instance, reason string) beacon.Instance {
	in = Failing(in, reason)
	in.Health.Panic = true
	return in
}

func with(in beacon.Instance, h beacon.Health) beacon.Instance {
	if in.Check == nil {
		c := Check
		in.Check = &c
	}
	in.Health = &h
	return in
}

// Put writes in (its ID, Status and RegisteredAt set) at its key under ks,
// bound to no lease, and its verdict in.Health beside it: nil or unknown
// leave no verdict stored. An instance with Health must declare a Check.
func Put(ctx context.Context, st store.Store, ks beacon.Keyspace, in beacon.Instance) error {
	if in.Health != nil && in.Check == nil {
		return fmt.Errorf("healthtest: instance %s has a verdict but declares no check: use Failing, Passing, Unknown or Panic", in.Ref())
	}
	if err := in.Validate(); err != nil {
		return fmt.Errorf("healthtest: %w", err)
	}
	hkey := ks.HealthKey(in.Ref())
	if in.Health == nil || in.Health.Status == beacon.HealthUnknown {
		if _, err := st.Delete(ctx, hkey); err != nil && !errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("healthtest: delete verdict: %w", err)
		}
	} else {
		stored := *in.Health
		stored.Panic = false // the view's, never stored
		v, err := json.Marshal(stored)
		if err != nil {
			return err
		}
		if _, err := st.Put(ctx, hkey, v); err != nil {
			return fmt.Errorf("healthtest: write verdict: %w", err)
		}
	}
	in.Health = nil // never stored with the instance
	v, err := in.MarshalJSON()
	if err != nil {
		return err
	}
	if _, err := st.Put(ctx, ks.Key(in.Ref()), v); err != nil {
		return fmt.Errorf("healthtest: write instance: %w", err)
	}
	return nil
}

// Delete removes the instance at ref and its verdict.
func Delete(ctx context.Context, st store.Store, ks beacon.Keyspace, ref beacon.Ref) error {
	for _, key := range []string{ks.HealthKey(ref), ks.Key(ref)} {
		if _, err := st.Delete(ctx, key); err != nil && !errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("healthtest: delete %s: %w", key, err)
		}
	}
	return nil
}

// Registry is a registry over a memory store, both closed with the test,
// whose instances the test writes with Put.
type Registry struct {
	*registry.StoreRegistry
	Store store.Store
}

// NewRegistry returns a Registry with the default registry.Config.
func NewRegistry(t testing.TB) *Registry {
	t.Helper()
	st := memory.New(memory.Config{})
	r, err := registry.New(st, registry.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = r.Close()
		_ = st.Close()
	})
	return &Registry{StoreRegistry: r, Store: st}
}

// Put writes the instances, in order, with their verdicts (see Put).
func (r *Registry) Put(t testing.TB, ins ...beacon.Instance) {
	t.Helper()
	PutAll(t, r.Store, r.Keyspace(), ins...)
}

// PutAll writes the instances to st, in order, with their verdicts (see
// Put), failing the test on an error.
func PutAll(t testing.TB, st store.Store, ks beacon.Keyspace, ins ...beacon.Instance) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, in := range ins {
		if err := Put(ctx, st, ks, in); err != nil {
			t.Fatal(err)
		}
	}
}
