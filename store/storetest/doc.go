// Package storetest is the conformance suite of the store contract. Every
// backend runs it from a plain `go test`, with no flag or build tag:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t testing.TB) store.Store { return memory.New(memory.Config{}) }, storetest.Options{})
//	}
//
// Each guarantee of package store is a named check, a subtest that can be
// run alone (go test -run 'TestConformance/Contract/Lease/Revoke'):
//
//	Get/NotFound, Create/IfAbsent, Put/KeepsCreateRevision,
//	Update/CompareAndSwap, Delete/Plain, Delete/IfModRevision,
//	Revision/Monotonic, List/SnapshotRevision, List/PrefixIsolation,
//	Lease/ExpiryRemovesAllKeysAtOnce, Lease/Revoke, Lease/KeepAliveExtends,
//	Lease/EndedLease, Lease/Rebind, Watch/Ordering, Watch/ExactlyOnce,
//	Watch/ResumeFromRevision, Watch/FromNow, Watch/ListThenWatch,
//	Watch/PrefixIsolation, Watch/Cancel, Concurrency/CreateRace,
//	Concurrency/CASCounter, Limits/ValueSize, Limits/InvalidInput,
//	Txn/Atomic, Close/Idempotent (these run in parallel, under
//	"Contract/"), then Watch/Compacted and Leaks/WatchCancelAndClose (one
//	at a time: they compact history and count goroutines with goleak).
//
// Checks wait on events with a deadline (Options.Timeout), never on sleeps.
// A backend that cannot offer a guarantee lists the check in
// Options.Caveats with the reason; the check then reports that reason (as a
// skip) instead of passing silently, and docs/store.md lists it. An
// optional capability a backend lacks (store.Transactor, store.Compactor)
// is such a caveat too: the check fails until the backend declares it. A
// caveat naming no check fails the run, so a renamed check cannot hide one.
//
// Benchmark runs the measurements every backend reports (Put, Get, List of
// 1,000 keys, watch delivery); docs/store.md compares them.
package storetest
