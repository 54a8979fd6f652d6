// Package view is the versioned state both registries serve watchers
// from: registry's feeds (one per watched prefix of a store) and
// registry/kube's view (the InstanceSets and EndpointSlices of the watched
// namespaces). Each owner applies changes under its own mutex; watchers
// read immutable versions without it.
//
// # The structure
//
//	   Set / Delete / Deliver / Amend (owner's lock)        Version()
//	changes ─────────────────────────────▶ View ─────────────────────▶ *Version (immutable)
//	                                        │                           tree clone, Seq, Rev, Relists
//	                                        │
//	        ┌───────────────────────────────┴──────────────────────────────┐
//	        │ tree: copy-on-write B-tree of *Item by key (the current state) │
//	        │ rev:  the revision the state is at                             │
//	        │ log:  Change{Seq, Rev, Key, Before, After, Late}               │
//	        │       seq floorSeq+1 … seq, revisions above floorRev           │
//	        │ relists: re-listings so far (a watcher's next batch: Resync)   │
//	        └────────────────────────────────────────────────────────────────┘
//
//	watcher at version old ──▶ Since(old.Seq) ──ok──▶ DiffLog(old, cur)   one event per changed key
//	                                        └─trimmed─▶ DiffTrees(old, cur) a walk of both trees
//	                      (Memo: watchers at the same old version share one diff, each gets a copy)
//	new watcher from rev  ──▶ After(rev)  ──ok──▶ Resume(entries, cur)
//	                                        └─no──▶ Snapshot(cur)
//
// # Invariants (each pinned by a named test in view_test.go)
//
//   - Set logs a change unless the instance is unchanged (Equal); it
//     replaces the item either way. Delete and Deliver remove only the
//     very item the view holds at that key. Amend replaces the item at a
//     key at the current revision (a change no store event carries), Late
//     like Deliver's removals. Load logs nothing.
//   - Every change has the next Seq; a version is cached until the seq, the
//     revision or the re-listings change, and never changes afterwards.
//   - Since(seq) is every change after seq, or false once trimmed. Trim
//     keeps the log within twice its allowance in changes, max(MinLogLen,
//     items), and in the weight of its replaced and removed items,
//     max(MinLogBytes, the current items' weight), dropping the oldest
//     changes down to both allowances once past either: one full turnover
//     of the state always fits.
//   - After(rev) is every change at a later revision plus the Late ones at
//     rev (Deliver's and Amend's, after a batch was given at rev), or
//     false when the log no longer reaches back to rev (or after Rebase).
//   - A Memo computes the events of one pair of versions once, however many
//     ask at once, answers another pair only with that pair's events, and
//     gives each caller events of its own (memo_test.go).
//   - Applying DiffLog, DiffTrees or Resume to a consumer's state at the
//     older version gives the newer one (the model test).
//
// # What the owners add
//
// registry (feed.go) adds the store's list and watch, its connection
// state (stale, outage), the removal hold (hold.go: an item whose removal
// is held stays in the view until Deliver), the join of health verdicts
// and the panic threshold (health.go: a verdict's change, or a service
// entering or leaving panic, replaces the items it changes) and resume
// from a revision.
// registry/kube adds the join of InstanceSets with EndpointSlice readiness
// and re-listing rounds published as one step; its watchers select by
// query (the match argument of the diffs). Wake is the wake-up channel and
// terminal error both share.
package view
