package registry

import (
	"context"
	"errors"
	"fmt"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/store"
)

// Operator actions: drain or deregister any instance, whoever registered
// it (see Operator). They act as the registry's store identity, so that
// over etcd with authentication the etcd roles of that identity decide:
// Beacon's HTTP API runs them through a registry acting as the
// authenticated user. They need the instance's key only (read and write);
// the drain keeps the key's lease without attaching it (store.KeepLease),
// so etcd asks nothing about the lease's other keys, which may be in
// namespaces the operator may not write.

var _ Operator = (*StoreRegistry)(nil)

// maxOperatorAttempts bounds the compare-and-swap retries of one operator
// action on an instance that keeps changing.
const maxOperatorAttempts = 16

// DrainInstance implements Operator.
func (r *StoreRegistry) DrainInstance(ctx context.Context, ref beacon.Ref) (beacon.Instance, error) {
	if err := r.refuseWrite("drain an instance"); err != nil {
		return beacon.Instance{}, err
	}
	for range maxOperatorAttempts {
		cur, kv, err := r.get(ctx, ref)
		if err != nil {
			return beacon.Instance{}, err
		}
		if cur.Status == beacon.StatusDraining {
			return cur, nil
		}
		next := cur.Clone()
		next.Status = beacon.StatusDraining
		val, err := encode(next, storedTTL(kv.Value))
		if err != nil {
			return beacon.Instance{}, err
		}
		_, err = r.st.Update(ctx, kv.Key, val, kv.ModRevision, store.KeepLease())
		switch {
		case err == nil:
			return next, nil
		case errors.Is(err, store.ErrConflict):
			continue
		case errors.Is(err, store.ErrNotFound):
			return beacon.Instance{}, fmt.Errorf("%w: %s", beacon.ErrNotFound, ref)
		}
		return beacon.Instance{}, fmt.Errorf("registry: drain %s: %w", ref, err)
	}
	return beacon.Instance{}, fmt.Errorf("registry: drain %s: %w (it kept changing)", ref, store.ErrConflict)
}

// checkOperatorWrite refuses action on ref, a write by ref alone (no
// secret), on a read-only layout, for a ref the layout does not hold, and
// once the registry is closed.
func (r *StoreRegistry) checkOperatorWrite(action string, ref beacon.Ref) error {
	if err := r.refuseWrite(action); err != nil {
		return err
	}
	if err := r.checkRef(ref); err != nil {
		return err
	}
	if r.closed.Load() {
		return ErrClosed
	}
	return nil
}

// DeregisterInstance implements Operator. It deletes whatever is stored at
// the instance's key, also a value that is not a valid instance (which
// List and Watch skip).
func (r *StoreRegistry) DeregisterInstance(ctx context.Context, ref beacon.Ref) error {
	if err := r.checkOperatorWrite("deregister an instance", ref); err != nil {
		return err
	}
	key := r.ks.Key(ref)
	for range maxOperatorAttempts {
		kv, err := r.st.Get(ctx, key)
		switch {
		case errors.Is(err, store.ErrNotFound):
			return fmt.Errorf("%w: %s", beacon.ErrNotFound, ref)
		case err != nil:
			return fmt.Errorf("registry: deregister %s: %w", ref, err)
		}
		_, err = r.st.Delete(ctx, key, store.IfModRevision(kv.ModRevision))
		switch {
		case err == nil:
			return nil
		case errors.Is(err, store.ErrConflict):
			continue
		case errors.Is(err, store.ErrNotFound):
			return fmt.Errorf("%w: %s", beacon.ErrNotFound, ref)
		}
		return fmt.Errorf("registry: deregister %s: %w", ref, err)
	}
	return fmt.Errorf("registry: deregister %s: %w (it kept changing)", ref, store.ErrConflict)
}
