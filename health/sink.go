package health

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store"
)

// verdictBackend is where a verdictWriter keeps the verdicts: the store
// behind a store registry (storeVerdicts: one key per instance, shared by
// the checkers, bound to this checker's lease), or the sink of a registry
// that keeps them itself (sinkVerdicts: registry.VerdictKeeper, the
// Kubernetes registry). The writer's slots, queue, workers and cut-off are
// the same over both.
type verdictBackend interface {
	// grant starts a lease the verdicts are bound to.
	grant(ctx context.Context, ttl time.Duration) (store.LeaseID, error)
	// keepAlive renews it once; store.ErrLeaseNotFound: it ended.
	keepAlive(ctx context.Context, l store.LeaseID) error
	// revoke ends it, and every verdict with it.
	revoke(ctx context.Context, l store.LeaseID) error
	// put writes h as the verdict on ref under the lease l.
	put(ctx context.Context, ref beacon.Ref, h beacon.Health, l store.LeaseID) error
	// deleteOurs deletes this checker's verdict on ref if match says so.
	deleteOurs(ctx context.Context, ref beacon.Ref, match func(beacon.Health) bool) error
	// perChecker reports that each checker's verdicts are kept apart (not
	// one key per instance that the next owner overwrites): a verdict on
	// an instance another checker owns now is deleted once the new
	// owner's own shows.
	perChecker() bool
}

// storeVerdicts keeps verdicts in the store: each at Keyspace.HealthKey,
// as beacon.Health JSON, under the checker's lease.
type storeVerdicts struct {
	st store.Store
	ks beacon.Keyspace
	id string
}

func (b *storeVerdicts) grant(ctx context.Context, ttl time.Duration) (store.LeaseID, error) {
	l, err := b.st.Grant(ctx, ttl)
	return l.ID, err
}

func (b *storeVerdicts) keepAlive(ctx context.Context, l store.LeaseID) error {
	_, err := b.st.KeepAlive(ctx, l)
	return err
}

func (b *storeVerdicts) revoke(ctx context.Context, l store.LeaseID) error {
	return b.st.Revoke(ctx, l)
}

func (b *storeVerdicts) put(ctx context.Context, ref beacon.Ref, h beacon.Health, l store.LeaseID) error {
	data, err := json.Marshal(h)
	if err != nil {
		return err
	}
	_, err = b.st.Put(ctx, b.ks.HealthKey(ref), data, store.WithLease(l))
	return err
}

// deleteOurs deletes the verdict on ref if it names this checker and match
// says so, with compare-and-delete on the revision read: a verdict another
// checker wrote meanwhile stays.
func (b *storeVerdicts) deleteOurs(ctx context.Context, ref beacon.Ref, match func(beacon.Health) bool) error {
	key := b.ks.HealthKey(ref)
	kv, err := b.st.Get(ctx, key)
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	var h beacon.Health
	if json.Unmarshal(kv.Value, &h) != nil || h.Checker != b.id || !match(h) {
		return nil
	}
	_, err = b.st.Delete(ctx, key, store.IfModRevision(kv.ModRevision))
	if errors.Is(err, store.ErrNotFound) || errors.Is(err, store.ErrConflict) {
		return nil
	}
	return err
}

func (b *storeVerdicts) perChecker() bool { return false }

// sinkLease is the one "lease" of a sink: it never ends while the checker
// runs (the registry ignores the verdicts of a checker that is not live),
// and revoking it removes every verdict.
const sinkLease store.LeaseID = 1

// sinkVerdicts keeps verdicts in a registry.VerdictSink: this checker's
// own, which no other checker writes, so that deleting one needs no
// comparison (the writer asks to withdraw only a verdict it wrote failing).
type sinkVerdicts struct{ sink registry.VerdictSink }

func (b *sinkVerdicts) grant(context.Context, time.Duration) (store.LeaseID, error) {
	return sinkLease, nil
}
func (b *sinkVerdicts) keepAlive(context.Context, store.LeaseID) error { return nil }
func (b *sinkVerdicts) revoke(context.Context, store.LeaseID) error    { return b.sink.Close() }

func (b *sinkVerdicts) put(ctx context.Context, ref beacon.Ref, h beacon.Health, _ store.LeaseID) error {
	return b.sink.PutVerdict(ctx, ref, h)
}

func (b *sinkVerdicts) deleteOurs(ctx context.Context, ref beacon.Ref, _ func(beacon.Health) bool) error {
	return b.sink.DeleteVerdict(ctx, ref)
}

func (b *sinkVerdicts) perChecker() bool { return true }
