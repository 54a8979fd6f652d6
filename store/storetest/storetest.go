package storetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon/store"
	"go.uber.org/goleak"
)

// Factory returns a store for one check: a fresh in-process store, or a new
// client of a server shared by the whole run. Checks use disjoint key
// prefixes, so a shared server is fine. The suite closes every store it gets.
type Factory func(t testing.TB) store.Store

// Options adapt the suite to a backend.
type Options struct {
	// Caveats maps check names (e.g. "Watch/Compacted") to the reason this
	// backend cannot pass them. Such checks are skipped with the reason.
	Caveats map[string]string
	// LeaseTTL is the TTL lease checks ask for; default store.MinLeaseTTL.
	// Checks wait on the TTL the backend actually grants.
	LeaseTTL time.Duration
	// ExpiryGrace is how long after its TTL a lease may take to expire
	// (backends check expiry periodically); default 2 s.
	ExpiryGrace time.Duration
	// Timeout bounds every wait for an event; default 15 s.
	Timeout time.Duration
	// Compact compacts the store's history to rev, for backends that
	// compact some other way than store.Compactor.
	Compact func(ctx context.Context, s store.Store, rev int64) error
	// LeakOptions are extra goleak options for the leak check (goroutines
	// of a server running in the same process, for example).
	LeakOptions []goleak.Option
}

func (o *Options) defaults() {
	if o.LeaseTTL == 0 {
		o.LeaseTTL = store.MinLeaseTTL
	}
	if o.ExpiryGrace == 0 {
		o.ExpiryGrace = 2 * time.Second
	}
	if o.Timeout == 0 {
		o.Timeout = 15 * time.Second
	}
}

type check struct {
	name string
	fn   func(t *testing.T, h *harness)
}

// checks run in parallel with each other.
var checks = []check{
	{"Get/NotFound", testGetNotFound},
	{"Create/IfAbsent", testCreateIfAbsent},
	{"Put/KeepsCreateRevision", testPutKeepsCreateRevision},
	{"Update/CompareAndSwap", testUpdateCAS},
	{"Delete/Plain", testDeletePlain},
	{"Delete/IfModRevision", testDeleteIfModRevision},
	{"Revision/Monotonic", testRevisionsMonotonic},
	{"List/SnapshotRevision", testListSnapshotRevision},
	{"List/PrefixIsolation", testListPrefixIsolation},
	{"Lease/ExpiryRemovesAllKeysAtOnce", testLeaseExpiry},
	{"Lease/Revoke", testLeaseRevoke},
	{"Lease/KeepAliveExtends", testKeepAliveExtends},
	{"Lease/EndedLease", testEndedLease},
	{"Lease/Rebind", testLeaseRebind},
	{"Lease/KeepLease", testKeepLease},
	{"Watch/Ordering", testWatchOrdering},
	{"Watch/ExactlyOnce", testWatchExactlyOnce},
	{"Watch/ResumeFromRevision", testWatchResume},
	{"Watch/FromNow", testWatchFromNow},
	{"Watch/ListThenWatch", testListThenWatch},
	{"Watch/PrefixIsolation", testWatchPrefixIsolation},
	{"Watch/Cancel", testWatchCancel},
	{"Concurrency/CreateRace", testCreateRace},
	{"Concurrency/CASCounter", testCASCounter},
	{"Limits/ValueSize", testValueSize},
	{"Limits/InvalidInput", testInvalidInput},
	{"Txn/Atomic", testTxnAtomic},
	{"Close/Idempotent", testCloseIdempotent},
}

// soloChecks touch global state (history) or count goroutines, so they run
// one at a time after the parallel checks.
var soloChecks = []check{
	{"Watch/Compacted", testWatchCompacted},
	{"Leaks/WatchCancelAndClose", testNoLeaks},
}

// Run runs every check against stores from newStore.
func Run(t *testing.T, newStore Factory, opts Options) {
	opts.defaults()
	if err := checkCaveats(opts.Caveats); err != nil {
		t.Fatal(err)
	}
	t.Run("Contract", func(t *testing.T) {
		for _, c := range checks {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				runCheck(t, c, newStore, opts)
			})
		}
	})
	for _, c := range soloChecks {
		t.Run(c.name, func(t *testing.T) { runCheck(t, c, newStore, opts) })
	}
}

// checkCaveats refuses caveats that name no check: a typo or a renamed
// check would otherwise turn a declared exception into a silent pass or
// failure.
func checkCaveats(caveats map[string]string) error {
	var unknown []string
	for name, reason := range caveats {
		if !isCheck(name) {
			unknown = append(unknown, name)
		}
		if strings.TrimSpace(reason) == "" {
			return fmt.Errorf("storetest: caveat %q has no reason: say why the backend cannot offer the guarantee", name)
		}
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		return fmt.Errorf("storetest: Options.Caveats names unknown checks %q; use the names of CheckNames()", unknown)
	}
	return nil
}

func isCheck(name string) bool {
	return slices.Contains(CheckNames(), name)
}

// CheckNames returns the names of every check, in the order they run.
func CheckNames() []string {
	names := make([]string, 0, len(checks)+len(soloChecks))
	for _, c := range append(slices.Clip(checks), soloChecks...) {
		names = append(names, c.name)
	}
	return names
}

func runCheck(t *testing.T, c check, newStore Factory, opts Options) {
	if reason, ok := opts.Caveats[c.name]; ok {
		t.Skipf("not guaranteed by this backend: %s", reason)
	}
	h := &harness{newStore: newStore, opts: opts, prefix: uniquePrefix(c.name)}
	c.fn(t, h)
}

// harness gives checks their store, prefix and waiting helpers.
type harness struct {
	newStore Factory
	opts     Options
	prefix   string
}

// store returns a store closed at the end of the check.
func (h *harness) store(t *testing.T) store.Store {
	t.Helper()
	s := h.newStore(t)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// key returns a key under the check's prefix.
func (h *harness) key(parts ...string) string { return h.prefix + strings.Join(parts, "/") }

// ctx returns a context bounded by the check timeout.
func (h *harness) ctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), h.opts.Timeout+2*h.opts.LeaseTTL+h.opts.ExpiryGrace)
	t.Cleanup(cancel)
	return ctx
}

func uniquePrefix(name string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "/storetest/" + strings.ReplaceAll(name, "/", "-") + "-" + hex.EncodeToString(b[:]) + "/"
}

// events collects exactly n events from w, failing the check on an error,
// a closed channel or the timeout.
func (h *harness) events(t *testing.T, w store.WatchChan, n int) []store.Event {
	t.Helper()
	var got []store.Event
	deadline := time.After(h.opts.Timeout)
	for len(got) < n {
		select {
		case resp, ok := <-w:
			if !ok {
				t.Fatalf("watch closed after %d of %d events", len(got), n)
			}
			if resp.Err != nil {
				t.Fatalf("watch failed after %d of %d events: %v", len(got), n, resp.Err)
			}
			got = append(got, resp.Events...)
		case <-deadline:
			t.Fatalf("timed out after %v with %d of %d events", h.opts.Timeout, len(got), n)
		}
	}
	if len(got) > n {
		t.Fatalf("got %d events, want %d: %v", len(got), n, describe(got))
	}
	return got
}

// response waits for the next response of w.
func (h *harness) response(t *testing.T, w store.WatchChan) (store.WatchResponse, bool) {
	t.Helper()
	select {
	case resp, ok := <-w:
		return resp, ok
	case <-time.After(h.opts.Timeout):
		t.Fatalf("timed out after %v waiting for a watch response", h.opts.Timeout)
		return store.WatchResponse{}, false
	}
}

// expectOnly checks that w delivers nothing more right now: it writes a
// marker key and expects the marker's event to be the next one.
func (h *harness) expectOnly(t *testing.T, s store.Store, w store.WatchChan, marker string) {
	t.Helper()
	rev, err := s.Put(h.ctx(t), marker, []byte("marker"))
	if err != nil {
		t.Fatal(err)
	}
	h.expectNext(t, w, marker, rev)
}

// expectNext checks that the next event of w is the write of key at rev.
func (h *harness) expectNext(t *testing.T, w store.WatchChan, key string, rev int64) {
	t.Helper()
	evs := h.events(t, w, 1)
	if evs[0].KV.Key != key || evs[0].Revision() != rev {
		t.Fatalf("unexpected event %v, want %s@%d next", describe(evs), key, rev)
	}
}

func describe(evs []store.Event) string {
	var b strings.Builder
	for i, e := range evs {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %s@%d", e.Type, e.KV.Key, e.Revision())
	}
	return "[" + b.String() + "]"
}

func mustPut(t *testing.T, ctx context.Context, s store.Store, key, value string, opts ...store.WriteOption) int64 {
	t.Helper()
	rev, err := s.Put(ctx, key, []byte(value), opts...)
	if err != nil {
		t.Fatalf("Put(%q): %v", key, err)
	}
	return rev
}

func mustGet(t *testing.T, ctx context.Context, s store.Store, key string) store.KeyValue {
	t.Helper()
	kv, err := s.Get(ctx, key)
	if err != nil {
		t.Fatalf("Get(%q): %v", key, err)
	}
	return kv
}

func wantErr(t *testing.T, what string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: got error %v, want %v", what, err, target)
	}
}

// waitGone waits until key is absent, polling at most every 50 ms, and
// returns how long it took. Used only where no event can be awaited (a
// backend that expires keys without a watcher present).
func (h *harness) waitGone(t *testing.T, s store.Store, key string, within time.Duration) {
	t.Helper()
	ctx := h.ctx(t)
	deadline := time.Now().Add(within)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		_, err := s.Get(ctx, key)
		if errors.Is(err, store.ErrNotFound) {
			return
		}
		if err != nil {
			t.Fatalf("Get(%q): %v", key, err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("key %q still present %v later", key, within)
		}
		<-tick.C
	}
}
