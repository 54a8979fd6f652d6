package registry

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/beaconplane/beacon/store"
)

// The keeper renews the session lease and does nothing else: no listing,
// no write, no recovery ever runs in its goroutine, so a store call stuck
// on a hung member can delay a renewal by one attempt at most.
//
// The bound: a renewal starts TTL/3 after the last success and leaves 2/3
// of the TTL before the lease would expire. Each attempt is bounded by
// keepAliveTimeout (TTL/6, at least 100 ms, at most 2 s), and an attempt
// that timed out is retried at once (the etcd store then sends it to
// another member: see store/etcd's member probe). So even when every
// attempt that reaches a hung member waits out its whole timeout, at least
// four attempts fit before the lease expires, and the first that reaches a
// healthy member renews it.

// keepAliveInterval is the time between renewals: a third of the TTL.
func keepAliveInterval(ttl time.Duration) time.Duration {
	return max(ttl/3, 10*time.Millisecond)
}

// keepAliveTimeout bounds one keep-alive attempt.
func keepAliveTimeout(ttl time.Duration) time.Duration {
	return min(max(ttl/6, 100*time.Millisecond), 2*time.Second)
}

// keeper renews the session's lease every TTL/3 while one is held, until
// the registry closes.
func (s *session) keeper() {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		s.mu.Lock()
		l, held, due := s.lease, s.held, s.lastOK.Add(keepAliveInterval(s.ttl))
		s.mu.Unlock()
		wait := time.Until(due)
		if !held {
			wait = time.Hour
		}
		if wait > 0 {
			if !timer.Stop() {
				select {
				case <-timer.C:
				default:
				}
			}
			timer.Reset(wait)
			select {
			case <-s.r.ctx.Done():
				return
			case <-s.keepKick:
				continue // the lease changed: look again
			case <-timer.C:
				continue // due now (or the lease changed meanwhile)
			}
		}
		s.renew(l)
		if s.r.ctx.Err() != nil {
			return
		}
	}
}

// renew keeps lease l alive once, retrying until an attempt succeeds, the
// lease is found gone, another lease replaced it, or it would have expired
// (then the session is lost, with the old lease suspected still alive).
func (s *session) renew(l store.LeaseID) {
	bo := newBackoff(s.r.cfg.RetryMax)
	for {
		s.mu.Lock()
		if s.lease != l || !s.held {
			s.mu.Unlock()
			return
		}
		ttl := s.ttl
		deadline := s.lastOK.Add(ttl)
		s.mu.Unlock()
		remaining := time.Until(deadline)
		if remaining <= 0 {
			s.markLost(l, fmt.Errorf("no successful keep-alive for %v (the lease TTL)", ttl), true)
			return
		}
		limit := min(keepAliveTimeout(ttl), remaining)
		start := time.Now()
		ctx, cancel := context.WithTimeout(s.r.ctx, limit)
		granted, err := s.r.st.KeepAlive(ctx, l)
		cancel()
		took := time.Since(start)
		switch {
		case err == nil:
			s.mu.Lock()
			if s.lease == l && s.held {
				s.lastOK = start
				s.ttl = granted
			}
			s.mu.Unlock()
			return
		case s.r.ctx.Err() != nil:
			return
		case errors.Is(err, store.ErrLeaseNotFound):
			s.markLost(l, err, false)
			return
		case refused(err):
			// A changed password or a revoked user: retrying the same
			// credentials cannot succeed. Say so now rather than after a
			// TTL of failed keep-alives.
			s.markLost(l, err, false)
			return
		}
		s.r.m.keepAliveFailed()
		// An attempt that used up its time already waited: try again at
		// once (a hung member does not get the next one). One that failed
		// fast (store unreachable) backs off, leaving time for more tries.
		d := time.Duration(0)
		if took < limit*3/4 {
			d = min(bo.next(), max(time.Until(deadline)/4, 0))
		}
		s.r.log.Warn("session keep-alive failed; retrying", "lease", fmt.Sprintf("%x", l),
			"err", err, "took", took.Round(time.Millisecond), "retry_in", d,
			"lease_expires_in", time.Until(deadline).Round(time.Millisecond))
		if !sleep(s.r.ctx, d) {
			return
		}
	}
}
