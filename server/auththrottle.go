package server

import (
	"context"
	"encoding/hex"
	"slices"
	"sync"
	"time"
)

// Failed authentications. Each costs etcd a bcrypt check, and guessing
// passwords must stay slow, but a client address is not a client (every
// process of a host shares 127.0.0.1, everyone behind a NAT its gateway's
// address), so failures must not lock out anyone but the user guessed:
//   - at most maxFails failures per client address and user name within
//     failWindow, then 429 for that user from that address until the
//     window passes — unless the credentials presented are ones etcd
//     accepted within goodFor (a correct password is let through, and
//     still checked);
//   - past maxAddrFails failures from one address within the window,
//     whatever the names, the address's credential checks run one at a
//     time (addrGate): guesses spread over many names get one check in
//     flight, answered at etcd's bcrypt pace, while another user's correct
//     password from that address is checked after the ones before it — a
//     delay, never a refusal.
//
// Credentials that already succeeded are served from the cache and never
// throttled. The table of failures holds at most maxFailEntries keys (see
// failed), that of accepted credentials maxGood; every key is of a fixed
// size (a name is kept only as a salted hash), so that names as long as a
// request's headers allow cannot make the tables large.
const (
	maxFails       = 20
	maxAddrFails   = 100
	failWindow     = time.Minute
	maxFailEntries = 10000
	goodFor        = 24 * time.Hour
	maxGood        = 4096
)

// loginThrottle counts failed authentications per client address and user
// and remembers the credentials etcd accepted lately (see the constants
// above). It holds one lock, its own.
type loginThrottle struct {
	salt []byte
	now  func() time.Time

	mu    sync.Mutex
	fails map[string][]time.Time // failed authentications per client address, and per address and user
	good  map[string]time.Time   // credentials (hashed keys) etcd accepted lately, and when
	gates map[string]*addrGate   // one credential check at a time for addresses past maxAddrFails
}

func newLoginThrottle(now func() time.Time) *loginThrottle {
	return &loginThrottle{salt: newSalt(), now: now,
		fails: map[string][]time.Time{}, good: map[string]time.Time{}, gates: map[string]*addrGate{}}
}

// failKeys are the keys a failure of user from addr counts under: the
// address and the user's salted hash, and the address alone.
func (v *loginThrottle) failKeys(addr, user string) [2]string {
	sum := saltedSum(v.salt, user)
	return [2]string{addr + " " + hex.EncodeToString(sum[:12]), addr}
}

// throttled reports how long a client at addr must wait before it may try
// id's user's credentials again, after too many failures of that user from
// that address; credentials etcd accepted lately are never throttled.
func (v *loginThrottle) throttled(addr string, id identity) time.Duration {
	key := id.key(v.salt)
	v.mu.Lock()
	defer v.mu.Unlock()
	now := v.now()
	if at, ok := v.good[key]; ok && now.Sub(at) < goodFor {
		return 0
	}
	kept := v.recentLocked(v.failKeys(addr, id.throttleName())[0], now)
	if len(kept) < maxFails {
		return 0
	}
	return failWindow - now.Sub(kept[len(kept)-maxFails])
}

// succeeded remembers that etcd accepted id's credentials.
func (v *loginThrottle) succeeded(id identity) {
	key := id.key(v.salt)
	v.mu.Lock()
	defer v.mu.Unlock()
	now := v.now()
	v.good[key] = now
	if len(v.good) <= maxGood {
		return
	}
	// Down to nine tenths, oldest first, so that this work is rare.
	type entry struct {
		key string
		at  time.Time
	}
	all := make([]entry, 0, len(v.good))
	for k, at := range v.good {
		all = append(all, entry{k, at})
	}
	slices.SortFunc(all, func(a, b entry) int { return a.at.Compare(b.at) })
	for _, e := range all[:len(all)-maxGood*9/10] {
		delete(v.good, e.key)
	}
}

// addrGate lets one credential check of an address run at a time.
type addrGate struct {
	ch   chan struct{}
	refs int
}

// gate waits, when addr has failed maxAddrFails times within the window,
// until no other credential check of addr runs; release ends the check.
// It fails only if ctx ends first.
func (v *loginThrottle) gate(ctx context.Context, addr string) (release func(), err error) {
	v.mu.Lock()
	if len(v.recentLocked(addr, v.now())) < maxAddrFails {
		v.mu.Unlock()
		return func() {}, nil
	}
	g := v.gates[addr]
	if g == nil {
		g = &addrGate{ch: make(chan struct{}, 1)}
		v.gates[addr] = g
	}
	g.refs++
	v.mu.Unlock()
	done := func() {
		v.mu.Lock()
		if g.refs--; g.refs == 0 {
			delete(v.gates, addr)
		}
		v.mu.Unlock()
	}
	select {
	case g.ch <- struct{}{}:
		return func() { <-g.ch; done() }, nil
	case <-ctx.Done():
		done()
		return nil, ctx.Err()
	}
}

// recentLocked drops the failures of key older than the window and
// returns the rest, oldest first.
func (v *loginThrottle) recentLocked(key string, now time.Time) []time.Time {
	kept := v.fails[key][:0]
	for _, t := range v.fails[key] {
		if now.Sub(t) < failWindow {
			kept = append(kept, t)
		}
	}
	if len(kept) == 0 {
		delete(v.fails, key)
		return nil
	}
	v.fails[key] = kept
	return kept
}

// failed records a failed authentication of user from addr.
func (v *loginThrottle) failed(addr, user string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	now := v.now()
	for _, key := range v.failKeys(addr, user) {
		v.fails[key] = append(v.fails[key], now)
		// Only the last maxAddrFails count; older ones need no room.
		if n := len(v.fails[key]); n > maxAddrFails {
			v.fails[key] = append(v.fails[key][:0], v.fails[key][n-maxAddrFails:]...)
		}
	}
	if len(v.fails) > maxFailEntries {
		v.boundLocked(now)
	}
}

// boundLocked shrinks the table of failures to nine tenths of
// maxFailEntries, so that this work is rare: it forgets what the window
// forgot, then the keys that throttle nobody, then the others, oldest
// last failure first — so that a flood of new entries never pushes out a
// throttle.
func (v *loginThrottle) boundLocked(now time.Time) {
	for key := range v.fails {
		v.recentLocked(key, now)
	}
	if len(v.fails) <= maxFailEntries {
		return
	}
	type entry struct {
		key       string
		throttles bool
		last      time.Time
	}
	all := make([]entry, 0, len(v.fails))
	for key, ts := range v.fails {
		all = append(all, entry{key, len(ts) >= maxFails, ts[len(ts)-1]})
	}
	slices.SortFunc(all, func(a, b entry) int {
		if a.throttles != b.throttles {
			if a.throttles {
				return 1
			}
			return -1
		}
		return a.last.Compare(b.last)
	})
	for _, e := range all[:len(all)-maxFailEntries*9/10] {
		delete(v.fails, e.key)
	}
}
