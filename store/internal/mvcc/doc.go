// Package mvcc is the one in-memory MVCC core behind Beacon's in-process
// store backends: store/memory is a thin shell over it, store/file keeps its
// state and serves its watches from it, and store/nats (which keeps no state
// of its own) checks writes with its Change rules.
//
// # What the core owns
//
//   - The versioned key space: every key with its value, create and mod
//     revisions and lease, in a B-tree ordered by key, and the store's
//     revision, which each applied change raises by exactly one.
//   - The checks of the store contract: a Change (Create, Put, Update,
//     Delete, a transaction, the end of a lease) is checked against the
//     current state — create-if-absent, compare-and-swap, KeepLease, the
//     transaction's preconditions in op order, the lease being alive (a hook
//     the backend supplies) — and turned into the events of one revision.
//     A refused change writes nothing.
//   - The event log with its bounds: every event from the compaction
//     watermark up to the current revision, in revision order. Optional
//     bounds, in revisions (Config.History) and in what the events weigh
//     (Config.HistoryBytes, EventSize each; the current revision is kept
//     whole), compact older revisions after each commit; Compact and
//     CompactTo move the watermark on demand, and Window tells a backend
//     that compacts by its own records (file) where the bounds would. A watch from below
//     the watermark ends with a *store.CompactedError.
//   - Watchers: each watch is one goroutine that reads the shared log from
//     its next revision under the lock, copies what matches its prefix (at
//     most MaxBatch events, never splitting a revision) and sends it
//     without the lock. A writer only closes a channel to wake them, so a
//     slow watcher never blocks a writer or another watcher: it falls
//     behind, catches up from the log, and ends with a *store.CompactedError
//     only if the window moved past it. Events reach every watcher in
//     revision order, each exactly once.
//   - Lease → keys bookkeeping: which keys are bound to which lease, kept
//     with every applied event, so that EndLease deletes all of a lease's
//     keys in one revision (sorted by key).
//
// # What a backend adds
//
//   - Lease lifetimes: TTLs, deadlines, expiry and the lease table (memory:
//     a heap and a timer; file: lease files on disk). The core only asks the
//     backend, through Config.LeaseAlive, whether a write may bind a lease.
//   - How a change becomes durable. Memory calls Commit: check and apply
//     under one lock. File calls Prepare under its write lock, appends the
//     events to its log, fsyncs, then calls Apply; it also replays other
//     processes' records through Apply, installs snapshots (Install) and
//     compacts by log records (CompactTo).
//   - Its own errors, limits on input before the core sees it, and Close.
//
// # Locking
//
// One mutex guards the whole state, held only for in-memory work: never
// across a send to a watcher nor any I/O of the core's own. The
// Config.LeaseAlive hook runs under it, so a backend's lease lock is taken
// after the core's, never before.
package mvcc
