package registry

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/store"
)

// refuse answers a caller of op ("heartbeat", "update", "deregister")
// whose secret did not prove its ownership of the registration at ref
// (err, from owns). An answer must not tell a wrong secret from a right
// one: where a right secret exists, and the store would refuse this
// caller the change even with it (a user who may read the namespace but
// not write it), the answer is the permission error the right secret gets
// (permissionDenied), else the error of an unknown instance.
//
// The store is asked with an update that can never apply (no key has that
// revision): etcd checks a transaction's permissions — the key's, and
// those of every key bound to the lease it attaches, as a renewal and a
// revocation check — before its condition, and writes nothing. The answer
// is kept per namespace for permCacheFor, so that wrong secrets cost the
// store one such transaction per namespace and interval, not one each.
func (r *StoreRegistry) refuse(ctx context.Context, op string, ref beacon.Ref, kv store.KeyValue, err error) error {
	if _, ok := errors.AsType[errWrongSecret](err); !ok {
		return err
	}
	denied, known := r.perms.get(ref.Namespace, time.Now())
	if !known {
		_, perr := r.st.Update(ctx, kv.Key, kv.Value, math.MaxInt64, store.WithLease(kv.Lease))
		switch {
		case errors.Is(perr, store.ErrPermissionDenied):
			denied = true
		case perr == nil || errors.Is(perr, store.ErrConflict) || errors.Is(perr, store.ErrNotFound):
		default:
			// The store could not say (unreachable): as for any other call.
			return fmt.Errorf("registry: %s %s: %w", op, ref, perr)
		}
		r.perms.put(ref.Namespace, denied, time.Now())
	}
	if denied {
		return permissionDenied(op, ref)
	}
	return notFound(ref)
}

// permissionDenied is the one answer to a caller the store does not allow
// op on ref, whether its secret was right or wrong (refuse).
func permissionDenied(op string, ref beacon.Ref) error {
	return fmt.Errorf("registry: %s %s: %w", op, ref, store.ErrPermissionDenied)
}

// permCacheFor is how long refuse keeps the store's answer for a
// namespace; permCacheMax bounds the namespaces kept.
const (
	permCacheFor = 10 * time.Second
	permCacheMax = 1024
)

// permCache holds, per namespace, whether the store refused the
// registry's user a change of an HTTP registration's keys, and when it
// said so. The zero value is empty.
type permCache struct {
	mu sync.Mutex
	m  map[string]permAnswer
}

type permAnswer struct {
	denied bool
	at     time.Time
}

func (c *permCache) get(ns string, now time.Time) (denied, known bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	a, ok := c.m[ns]
	if !ok || now.Sub(a.at) >= permCacheFor {
		return false, false
	}
	return a.denied, true
}

func (c *permCache) put(ns string, denied bool, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= permCacheMax {
		c.m = make(map[string]permAnswer) // forget everything: it is a cache
	}
	c.m[ns] = permAnswer{denied: denied, at: now}
}
