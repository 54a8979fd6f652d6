package registry

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/store"
)

// Instances bound to leases the caller owns.
//
// A server that registers instances on behalf of remote clients (Beacon's
// HTTP API) cannot use the session: each client must vanish when *it* stops
// heartbeating, so each gets its own lease. These methods are the building
// blocks, with the same validation and uniqueness rules as Register:
//
//	in, lease, err := r.RegisterWithTTL(ctx, in, 15*time.Second) // grant + create-if-absent
//	ttl, err := r.Heartbeat(ctx, in.Ref(), lease.ID)             // keep alive
//	in, err = r.UpdateLeased(ctx, in.Ref(), lease.ID, mutate)     // compare-and-swap
//	err = r.DeregisterLeased(ctx, in.Ref(), lease.ID)            // delete, then revoke
//
// Errors: a bad instance or TTL matches beacon.ErrInvalid or ErrInvalidTTL;
// an ID held by another registration beacon.ErrAlreadyRegistered; an unknown
// instance, or one whose lease ended, beacon.ErrNotFound; an instance bound
// to another lease than the one presented ErrLeaseMismatch; an unreachable
// store store.ErrUnavailable. The session's own lease is never accepted.

// GrantLease grants a lease with the given TTL, within [MinLeaseTTL,
// MaxLeaseTTL], for the caller to keep alive.
func (r *StoreRegistry) GrantLease(ctx context.Context, ttl time.Duration) (store.Lease, error) {
	if err := ValidateTTL(ttl); err != nil {
		return store.Lease{}, err
	}
	if r.closed.Load() {
		return store.Lease{}, ErrClosed
	}
	l, err := r.st.Grant(ctx, ttl)
	if err != nil {
		return store.Lease{}, fmt.Errorf("registry: grant lease: %w", err)
	}
	r.leased.granted(l.ID, l.TTL)
	return l, nil
}

// KeepAliveLease renews a caller-owned lease and returns its TTL. A lease
// that ended gives an error matching beacon.ErrNotFound and
// store.ErrLeaseNotFound.
func (r *StoreRegistry) KeepAliveLease(ctx context.Context, id store.LeaseID) (time.Duration, error) {
	if err := r.checkLease(id); err != nil {
		return 0, err
	}
	ttl, err := r.st.KeepAlive(ctx, id)
	if err != nil {
		if errors.Is(err, store.ErrLeaseNotFound) {
			r.leased.ended(id)
		}
		return 0, leaseError("keep alive", id, err)
	}
	r.leased.renewed(id, ttl)
	return ttl, nil
}

// RevokeLease ends a caller-owned lease, deleting every instance bound to
// it. A lease that already ended gives an error matching beacon.ErrNotFound.
func (r *StoreRegistry) RevokeLease(ctx context.Context, id store.LeaseID) error {
	if err := r.checkLease(id); err != nil {
		return err
	}
	if err := r.st.Revoke(ctx, id); err != nil {
		if errors.Is(err, store.ErrLeaseNotFound) {
			r.leased.ended(id)
		}
		return leaseError("revoke", id, err)
	}
	r.leased.ended(id)
	return nil
}

func (r *StoreRegistry) checkLease(id store.LeaseID) error {
	if r.closed.Load() {
		return ErrClosed
	}
	if id == store.NoLease {
		return fmt.Errorf("%w: lease 0: a caller-owned lease is required", beacon.ErrInvalid)
	}
	if r.sess.ours(id) {
		return fmt.Errorf("%w: lease %x is the registry's own session lease", ErrLeaseMismatch, id)
	}
	return nil
}

func leaseError(op string, id store.LeaseID, err error) error {
	if errors.Is(err, store.ErrLeaseNotFound) {
		return fmt.Errorf("registry: %s lease %x: %w (%w)", op, id, beacon.ErrNotFound, err)
	}
	return fmt.Errorf("registry: %s lease %x: %w", op, id, err)
}

// RegisterLeased writes an instance bound to a lease the caller owns and
// keeps alive (GrantLease, KeepAliveLease). Empty fields are filled as by
// Register and the instance is validated; the write is create-if-absent,
// so an ID held by anyone gives beacon.ErrAlreadyRegistered. It returns the
// instance as written and the revision of the write.
func (r *StoreRegistry) RegisterLeased(ctx context.Context, in beacon.Instance, lease store.LeaseID) (beacon.Instance, int64, error) {
	if err := r.checkLease(lease); err != nil {
		return beacon.Instance{}, 0, err
	}
	in, val, err := r.prepare(in)
	if err != nil {
		return beacon.Instance{}, 0, err
	}
	key := r.ks.Key(in.Ref())
	rev, err := r.st.Create(ctx, key, val, store.WithLease(lease))
	switch {
	case err == nil:
		r.leased.registered(lease, in.Ref())
		return in, rev, nil
	case errors.Is(err, store.ErrKeyExists):
		if kv, gerr := r.st.Get(ctx, key); gerr == nil {
			return beacon.Instance{}, 0, holderError(in.Ref(), kv)
		}
		return beacon.Instance{}, 0, fmt.Errorf("%w: %s", beacon.ErrAlreadyRegistered, in.Ref())
	case errors.Is(err, store.ErrLeaseNotFound):
		return beacon.Instance{}, 0, leaseError("register with", lease, err)
	}
	return beacon.Instance{}, 0, fmt.Errorf("registry: register %s: %w", in.Ref(), err)
}

// RegisterWithTTL grants a lease with ttl and writes the instance bound to
// it, as RegisterLeased. If the write fails, the lease is revoked: nothing
// is left half-done.
func (r *StoreRegistry) RegisterWithTTL(ctx context.Context, in beacon.Instance, ttl time.Duration) (beacon.Instance, store.Lease, error) {
	if err := ValidateTTL(ttl); err != nil {
		return beacon.Instance{}, store.Lease{}, err
	}
	// Validate before granting, so that bad input costs no lease.
	if _, _, err := r.prepare(in); err != nil {
		return beacon.Instance{}, store.Lease{}, err
	}
	l, err := r.GrantLease(ctx, ttl)
	if err != nil {
		return beacon.Instance{}, store.Lease{}, err
	}
	out, _, err := r.RegisterLeased(ctx, in, l.ID)
	if err != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ttl)
		defer cancel()
		r.leased.ended(l.ID)
		if rerr := r.st.Revoke(rctx, l.ID); rerr != nil && !errors.Is(rerr, store.ErrLeaseNotFound) {
			r.log.Warn("revoking the lease of a failed registration failed; it expires by itself",
				"lease", fmt.Sprintf("%x", l.ID), "ttl", l.TTL, "err", rerr)
		}
		return beacon.Instance{}, store.Lease{}, err
	}
	return out, l, nil
}

// getLeased returns the instance at ref if it is bound to lease.
func (r *StoreRegistry) getLeased(ctx context.Context, ref beacon.Ref, lease store.LeaseID) (beacon.Instance, store.KeyValue, error) {
	if err := r.checkLease(lease); err != nil {
		return beacon.Instance{}, store.KeyValue{}, err
	}
	in, kv, err := r.get(ctx, ref)
	if err != nil {
		return beacon.Instance{}, store.KeyValue{}, err
	}
	if kv.Lease != lease {
		return beacon.Instance{}, store.KeyValue{}, fmt.Errorf("%w: %s is not bound to lease %x", ErrLeaseMismatch, ref, lease)
	}
	return in, kv, nil
}

// Heartbeat keeps alive the lease of the instance at ref, which must be
// bound to lease, and returns the lease's TTL. An unknown instance, or one
// whose lease ended, gives an error matching beacon.ErrNotFound.
func (r *StoreRegistry) Heartbeat(ctx context.Context, ref beacon.Ref, lease store.LeaseID) (time.Duration, error) {
	if _, _, err := r.getLeased(ctx, ref, lease); err != nil {
		if errors.Is(err, beacon.ErrNotFound) {
			r.leased.deregistered(lease, ref)
		}
		return 0, err
	}
	return r.KeepAliveLease(ctx, lease)
}

// UpdateLeased changes the instance at ref, which must be bound to lease,
// with compare-and-swap: mutate receives the stored instance and may change
// Address, Transport, Metadata and Status (not its identity). Concurrent
// writes are retried. It returns the instance as written.
func (r *StoreRegistry) UpdateLeased(ctx context.Context, ref beacon.Ref, lease store.LeaseID, mutate func(*beacon.Instance)) (beacon.Instance, error) {
	for range 16 {
		cur, kv, err := r.getLeased(ctx, ref, lease)
		if err != nil {
			return beacon.Instance{}, err
		}
		next := cur.Clone()
		mutate(&next)
		if next.Ref() != cur.Ref() || !next.RegisteredAt.Equal(cur.RegisteredAt) {
			return beacon.Instance{}, fmt.Errorf("%w (%s)", ErrIdentityChanged, ref)
		}
		if next.Status == "" {
			next.Status = beacon.StatusServing
		}
		if err := next.ValidateWith(r.cfg.MaxMetadataSize); err != nil {
			return beacon.Instance{}, err
		}
		val, err := encode(next)
		if err != nil {
			return beacon.Instance{}, err
		}
		_, err = r.st.Update(ctx, kv.Key, val, kv.ModRevision, store.WithLease(lease))
		switch {
		case err == nil:
			return next, nil
		case errors.Is(err, store.ErrConflict):
			continue
		case errors.Is(err, store.ErrNotFound):
			return beacon.Instance{}, fmt.Errorf("%w: %s", beacon.ErrNotFound, ref)
		case errors.Is(err, store.ErrLeaseNotFound):
			return beacon.Instance{}, leaseError("update with", lease, err)
		}
		return beacon.Instance{}, fmt.Errorf("registry: update %s: %w", ref, err)
	}
	return beacon.Instance{}, fmt.Errorf("registry: update %s: %w (too many concurrent writers)", ref, store.ErrConflict)
}

// DeregisterLeased deletes the instance at ref, which must be bound to
// lease. The lease itself stays (RevokeLease ends it; a lease that holds
// one instance can simply be revoked instead, which deletes it too).
func (r *StoreRegistry) DeregisterLeased(ctx context.Context, ref beacon.Ref, lease store.LeaseID) error {
	for range 16 {
		_, kv, err := r.getLeased(ctx, ref, lease)
		if err != nil {
			return err
		}
		_, err = r.st.Delete(ctx, kv.Key, store.IfModRevision(kv.ModRevision))
		switch {
		case err == nil:
			r.leased.deregistered(lease, ref)
			return nil
		case errors.Is(err, store.ErrConflict):
			continue
		case errors.Is(err, store.ErrNotFound):
			return fmt.Errorf("%w: %s", beacon.ErrNotFound, ref)
		}
		return fmt.Errorf("registry: deregister %s: %w", ref, err)
	}
	return fmt.Errorf("registry: deregister %s: %w (too many concurrent writers)", ref, store.ErrConflict)
}
