// Package file is a store.Store kept in a directory and shared, with no
// daemon, by the processes of one host (BEACON_DISCOVERY_BACKEND=file,
// BEACON_FILE_DIR=/path).
//
// # Layout
//
//	beacon-store.json   format marker (format and version); a non-empty
//	                    directory without it is refused (ErrNotStore)
//	lock                every change holds an exclusive flock on it
//	wal/<rev>.log       the write-ahead event log, in segments named by
//	                    their first revision
//	snapshot            the state at the last log truncation
//	leases/<id>         one file per lease; deadline = mtime + TTL
//
// Open creates a missing directory and an empty store in it, unless
// Config.MustExist is set (the commands that only read or remove: beacon
// ls, watch, rm): then a directory that does not exist or holds no store
// yet fails with ErrNoStore, so that a mistyped BEACON_FILE_DIR is an error
// rather than an empty listing.
//
// # How it works
//
// The log is the source of truth. A writer takes the lock, catches up with
// the log (applying records other processes appended), checks its
// precondition (create-if-absent, compare-and-swap, lease alive) against that
// state, appends one record for the new revision and fdatasyncs it before
// acknowledging. Every process keeps the state and a window of history in
// memory by following the log: it is woken by inotify (fsnotify) when the log
// grows, polls every PollInterval when notifications are unavailable, and
// also catches up before every read, so a read sees every write acknowledged
// before it began. Watches are served from the in-memory history, so they
// resume from any revision in the window, in any process. That state, its
// history and the watches are the MVCC core the memory store also runs on
// (store/internal/mvcc); this package adds the log, snapshots, lease files
// and the locking between processes.
//
// Leases are files. KeepAlive touches the file (under the lock); any process
// that finds a lease past its deadline ends it: under the lock it deletes all
// the lease's keys in one revision, then removes the file. Every process
// with the store open does so on a timer (ReapInterval, below any TTL), so
// watchers see a crashed process's keys deleted soon after its deadline,
// and every read first ends the expired leases of the keys it could
// return, so no read returns them after the deadline, whether or not a
// timer has run.
//
// Compaction truncates the log: when it holds twice History revisions, or
// its events weigh twice HistoryBytes in memory (a transaction or the end
// of a lease is one revision of many events), a writer cuts it back to the
// newest History revisions that weigh at most HistoryBytes (the current
// revision whole): it writes a snapshot (temporary file, fsync, rename, fsync of the
// directory), seals the segment, starts a new one and deletes the segments
// below the window. Watches from before the window end with a
// *store.CompactedError. Compact does the same on demand.
//
// # Guarantees
//
// The whole store contract holds, across processes: one global revision,
// create-if-absent and compare-and-swap under the lock, lease expiry deleting
// all keys at one revision, ordered exactly-once watches, and transactions
// (store.Transactor: several writes in one revision, all or nothing). There
// are no caveats in the conformance suite.
//
// # Replacing the directory
//
// A store is the directory whose lock file a process holds. Every write
// (under the lock) and the background loop (every second, or PollInterval
// without notifications) compare the lock file at the path with the one
// held. When the directory was moved away, removed or replaced, the process
// logs it, ends its watches with ErrReplaced, and opens the store now at the
// path; its old leases are gone there (store.ErrLeaseNotFound), so
// registrants register again. It never creates a store in place of a
// removed one; until one is there, reads and writes fail with ErrReplaced.
//
// # Permissions
//
// Files are created 0666 and directories 0777, less the process umask, so
// that users of one group can share a store: a setgid, group-writable
// directory and umask 002 (docs/store.md shows how).
//
// # Waiting for the lock
//
// A process stopped or hung while it holds the lock stops every writer of
// the host. Every wait for a lock (the store's, the write slot of this
// process in front of it, a lease file's, Open's) ends with the caller's
// context or Close, with an error naming the lock file and, when
// /proc/locks tells, the process holding it; a write whose caller gave up
// is not applied afterwards. A wait that lasts 5 s is logged.
//
// # Crashes and damage
//
//   - A write interrupted by a crash (even SIGKILL mid-write) was never
//     acknowledged; the torn record it leaves at the end of the log is cut
//     off by the next process that takes the lock, with a warning logged.
//   - Temporary files left by an interrupted snapshot or lease grant are
//     removed on Open.
//   - A lease file that cannot be parsed ends the lease (its keys are
//     deleted), with a warning.
//   - A writer whose log segment is shorter than it has read it (truncated
//     under the live processes) refuses to write a hole there and fails
//     with ErrCorrupt; a process that only reads logs it once.
//   - Any other damage (a checksum mismatch inside the log followed by more
//     data, a damaged snapshot) is refused with ErrCorrupt naming the file
//     and offset, and nothing is changed: move the directory away and restore
//     it from a backup.
//
// # Limits
//
// One host only: flock and inotify do not work across machines, and lease
// deadlines use the host's clock. Every process holds the current state and
// the history window in memory. Each write costs one fdatasync.
package file
