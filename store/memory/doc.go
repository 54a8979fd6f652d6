// Package memory is a complete in-process implementation of the store
// contract (BEACON_DISCOVERY_BACKEND=memory): revisions, compare-and-swap,
// leases that expire, watches that resume from any revision in a bounded
// history, compaction and transactions (store.Compactor, store.Transactor).
//
// It is a product backend, not a test double: it serves tests, development
// and single-process deployments, and it passes the same conformance suite
// (store/storetest) as etcd, with no caveat. Its data lives and dies with the
// process; two processes never share a memory store (use store/file on one
// host).
//
//	s := memory.New(memory.Config{History: 10_000})
//	defer s.Close()
//
// # Guarantees and limits
//
//   - Keys, revisions, history and watches are the MVCC core shared with
//     store/file (store/internal/mvcc). One mutex orders every read and
//     write, so every read sees every write acknowledged before it began,
//     and each write takes the next revision (the first write is revision
//     2, as in etcd). Leases are the memory store's own: a table and an
//     expiry heap under a second mutex, taken after the core's.
//   - Leases expire on a timer at their deadline (the TTL exactly as asked,
//     no rounding); a lease's keys are deleted in one revision.
//   - The compaction window: the store keeps the events of the last
//     Config.History revisions (DefaultHistory, 100,000, when zero), and of
//     those only the newest that weigh at most Config.HistoryBytes
//     (DefaultHistoryBytes, 64 MiB, when zero): a revision can hold many
//     events, so the bound in bytes is the bound on memory. The current
//     revision is kept whole; a negative bound is no bound. A watch from an
//     older revision ends with a *store.CompactedError, the signal to
//     re-list.
//   - Watches read from that shared history rather than from per-watcher
//     buffers: a slow watcher never blocks writers or other watchers, it
//     only falls behind, and if it falls further behind than the window it
//     ends with a *store.CompactedError.
//   - Keys, values and TTLs are checked against the same limits as every
//     backend (store.MaxKeySize, store.MaxValueSize, store.MinLeaseTTL,
//     store.MaxLeaseTTL). Memory use is the data plus the window of history.
//
// Close ends the expiry goroutine and every watch (their channels close);
// it is idempotent, and every call after it fails with store.ErrClosed.
package memory
