package registry

import (
	"context"
	"errors"
	"time"

	"github.com/beaconplane/beacon/internal/wait"
	"github.com/beaconplane/beacon/store"
)

// heartbeatAttempts bounds the attempts of one heartbeat's store call.
const heartbeatAttempts = 4

// retryTimedOut runs call with a deadline of limit, again while an
// attempt ran out of its time with the store unavailable, up to
// heartbeatAttempts attempts and while ctx allows: one attempt at a time.
// An attempt that failed before its deadline is an answer, as is a
// success.
//
// A store that leaves out servers that do not answer (store.Failover:
// etcd with several members) gets the chance to before the next attempt
// (awaitFailover), so that the retry does not go to the hung member the
// timed-out attempt reached: tried again at once, with the client's
// balancer choosing among three members, one heartbeat in three or so met
// it again and its client gave up.
//
// Attempts are not hedged (a second started beside a slow first): in the
// lease drill, hedged ownership reads made a leader resumed from SIGSTOP
// end 15 of 16 HTTP registrations that had been renewed in time (none
// without), while shorter sequential attempts for reads removed the
// failed renewals as well.
func retryTimedOut[T any](ctx context.Context, st store.Store, limit time.Duration, call func(context.Context) (T, error)) (T, error) {
	fo, _ := st.(store.Failover)
	for n := 1; ; n++ {
		var changed <-chan struct{}
		if fo != nil {
			changed = fo.ExcludedChanged()
		}
		actx, cancel := context.WithTimeout(ctx, limit)
		v, err := call(actx)
		timedOut := actx.Err() != nil
		cancel()
		if err == nil || ctx.Err() != nil || !timedOut || !errors.Is(err, store.ErrUnavailable) || n == heartbeatAttempts {
			return v, err
		}
		if fo != nil {
			awaitFailover(ctx, fo, changed, limit/2)
		}
	}
}

// awaitFailover waits, at most most, until the store has left out (or put
// back) a server since changed was taken — at once if it did while the
// attempt ran — or has probed its servers and found nothing to change.
func awaitFailover(ctx context.Context, fo store.Failover, changed <-chan struct{}, most time.Duration) {
	select {
	case <-changed:
		return
	default:
	}
	t := time.NewTimer(most)
	defer t.Stop()
	select {
	case <-changed:
	case <-fo.Probed():
	case <-t.C:
	case <-ctx.Done():
	}
}

// failover decides whether a write the store answered with ErrUnavailable
// is tried again: a member died or an election is under way, and the
// client's next attempt goes to another member or to the new leader. A
// follower SIGKILLed under load failed 51 of 300 registrations before
// (beacon bench cluster). The first retry is at once, later ones after a
// backoff; it gives up when ctx ends, the registry closes, or a lease TTL
// has passed since the first attempt (a write that cannot land within a
// TTL would be late for the lease anyway). Only writes that are safe to
// repeat use it: a create-if-absent and a compare-and-swap, whose repeat
// after an attempt that did land finds the key holding the same value
// under the same lease (writeOne settles that as written).
type failover struct {
	r     *StoreRegistry
	start time.Time
	tries int
	bo    *backoff
}

func (r *StoreRegistry) newFailover() *failover {
	return &failover{r: r, start: time.Now(), bo: newBackoff(r.cfg.RetryMax)}
}

// again reports whether the write that failed with err is to be tried
// again, after waiting its turn.
func (f *failover) again(ctx context.Context, err error) bool {
	if !errors.Is(err, store.ErrUnavailable) || ctx.Err() != nil || f.r.closed.Load() || time.Since(f.start) >= f.r.cfg.LeaseTTL {
		return false
	}
	f.tries++
	f.r.log.Debug("store unavailable; trying the write again", "attempt", f.tries+1, "err", err)
	if f.tries == 1 {
		return true
	}
	return wait.Sleep(ctx, f.bo.next())
}
