package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/beaconplane/beacon"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The same-operation ceiling: what one etcd member commits of the write a
// registration is — for each key a compare that it does not exist yet and
// a put under a lease — from a raw client (clientv3, one connection, one
// lease for the round, as Beacon's session has), in transactions as wide
// and as concurrent as etcd takes best for as many keys in flight as
// Beacon's workers. etcd's benchmark txn-put (the other ceiling) writes
// plain puts, without the compare or the lease: lighter work for etcd than
// a registration, so that ratio understates what Beacon's client leaves
// on the table; this one is the goal's baseline.

// ceilingSameOp is the Against of the rows measured against it.
const ceilingSameOp = "same-op ceiling"

// sameOpSide writes n keys as the same-operation ceiling does, width per
// transaction from workers/width goroutines, then revokes the lease (its
// keys go with it). The latencies are the transactions'.
func (rb *registerBench) sameOpSide(ctx context.Context, round string, n, workers, width int) (registerResult, error) {
	var r registerResult
	var keys, vals []string
	if rb.ceilingKeys != nil {
		keys, vals = rb.ceilingKeys(round, n)
	} else {
		// From instances, as Beacon's side starts; building the keys and
		// values (encoding/json, as the raw grant+put client does) is
		// measured apart (r.build), outside the rate.
		insts := benchInstances("txn-"+round, n)
		self := os.Getpid()
		cpu0 := processCPU(self)
		keys, vals = sameOpKeys(insts)
		r.build = processCPU(self) - cpu0
	}
	l, err := rb.raw.cli.Grant(ctx, rawLeaseTTL)
	if err != nil {
		return r, fmt.Errorf("same-op ceiling: grant: %w", err)
	}
	rb.raw.track(l.ID)
	txns := (n + width - 1) / width
	// Each transaction builds its compares and puts, as a client does; the
	// keys and values are built before the clock, so that the rate is
	// etcd's, not this client's.
	rb.measureCPU(&r, func() {
		r.total, r.lat, err = run(ctx, txns, max(1, workers/width), func(ctx context.Context, t int) error {
			lo, hi := t*width, min(n, (t+1)*width)
			cmps, ops := make([]clientv3.Cmp, 0, hi-lo), make([]clientv3.Op, 0, hi-lo)
			for i := lo; i < hi; i++ {
				cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(keys[i]), "=", 0))
				ops = append(ops, clientv3.OpPut(keys[i], vals[i], clientv3.WithLease(l.ID)))
			}
			resp, err := rb.raw.cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
			switch {
			case err != nil:
				return fmt.Errorf("same-op ceiling: txn: %w", err)
			case !resp.Succeeded:
				return errors.New("same-op ceiling: a key it writes existed already")
			}
			return nil
		})
	})
	if rerr := rb.raw.revokeAll(ctx); err == nil {
		err = rerr
	}
	rb.settle(ctx)
	return r, err
}

// sameOpKeys are the keys (the Beacon layout under /bench-txn) and values
// of insts, built before the clock starts.
func sameOpKeys(insts []beacon.Instance) (keys, vals []string) {
	keys, vals = make([]string, len(insts)), make([]string, len(insts))
	for i, in := range insts {
		keys[i] = "/bench-txn" + beacon.ServicesDir + in.Ref().String()
		vals[i] = rawValue(in)
	}
	return keys, vals
}

// pickWidth measures rate(width) once for each of ceilingBatches(workers)
// and returns the fastest width, with what each width gave
// ("clients×width rate/s, ...").
func (rb *registerBench) pickWidth(ctx context.Context, what string, workers int,
	rate func(ctx context.Context, width int) (float64, error)) (int, string, error) {
	best, bestRate := 0, 0.0
	var tried []string
	for _, b := range ceilingBatches(workers) {
		rb.cfg.Logger.Info("register: choosing a ceiling's transaction width", "ceiling", what, "workers", workers, "width", b)
		r, err := rate(ctx, b)
		if err != nil {
			return 0, "", err
		}
		tried = append(tried, fmt.Sprintf("%d×%d %.0f/s", max(1, workers/b), b, r))
		if r > bestRate {
			best, bestRate = b, r
		}
	}
	return best, strings.Join(tried, ", "), nil
}
