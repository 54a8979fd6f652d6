package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/beaconplane/beacon"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Settling between phases.
//
// A same-op ceiling round writes its keys under the watched services and
// revokes them, and the watchers deliver all of it; a Beacon round's
// registrations reach the watchers as its last ones are written. The next
// phase's register → watcher latency must measure that phase, not the
// backlog of the one before (issue 26: with the backlog, the rounds that
// followed a ceiling round had p99 1.5–4.6× the one that did not), so
// each phase starts once every watcher has had a sentinel written after
// the last one: one instance per service, put by the raw client under a
// lease of its own, then revoked.

// sentinelBase is below the sentinels' instance numbers: beyond any run's
// instances and ceiling keys.
const sentinelBase = 1 << 40

// firstSentinel is the first sentinel's instance number: a multiple of
// the services, so that sentinel firstSentinel + (g-1)×services + s, of
// settle g, is of service s.
func (cb *clusterBench) firstSentinel() int {
	return (sentinelBase/cb.cfg.Services + 1) * cb.cfg.Services
}

// sentinel reports whether instance i is a sentinel, and of which
// settle.
func (cb *clusterBench) sentinel(i int) (gen int, ok bool) {
	first := cb.firstSentinel()
	if i < first {
		return 0, false
	}
	return (i-first)/cb.cfg.Services + 1, true
}

// settle writes settle number cb.settles+1's sentinels and waits (at most
// limit) until every watcher has had its service's, then revokes them. It
// returns how long the watchers took.
func (cb *clusterBench) settle(ctx context.Context, cli *clientv3.Client, limit time.Duration) (time.Duration, error) {
	cb.settles++
	gen := cb.settles
	lease, err := cli.Grant(ctx, 60)
	if err != nil {
		return 0, fmt.Errorf("bench: settle: %w", err)
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_, _ = cli.Revoke(rctx, lease.ID) // its keys go: the watchers see removals of what is not the run's
	}()
	var ops []clientv3.Op
	for s := range cb.cfg.Services {
		in := cb.instance(cb.firstSentinel() + (gen-1)*cb.cfg.Services + s)
		ops = append(ops, clientv3.OpPut(beacon.ServicesDir+in.Ref().String(), rawValue(in), clientv3.WithLease(lease.ID)))
	}
	start := time.Now()
	for len(ops) > 0 {
		n := min(len(ops), 128) // etcd's default --max-txn-ops
		if _, err := cli.Txn(ctx).Then(ops[:n]...).Commit(); err != nil {
			return 0, fmt.Errorf("bench: settle: %w", err)
		}
		ops = ops[n:]
	}
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	for {
		if cb.settled(gen) {
			return time.Since(start), nil
		}
		select {
		case <-cb.changed:
		case <-deadline.C:
			return time.Since(start), fmt.Errorf("bench: settle: watchers still without the sentinel after %v", limit)
		case <-ctx.Done():
			return time.Since(start), ctx.Err()
		}
	}
}

// settled reports whether every watcher has had settle gen's sentinel.
func (cb *clusterBench) settled(gen int) bool {
	for _, w := range cb.watchers {
		if w.settled.Load() < int64(gen) {
			return false
		}
	}
	return true
}
