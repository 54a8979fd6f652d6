// Package etcdwatch owns the one hard idea of watching etcd: a watch that
// is never silently stale and never loses or repeats an event. None of
// its users re-derives etcd's watch semantics:
//
//   - Run (over State) is the whole watch, its I/O included: the etcd
//     store (store/etcd) and bootstrap's wait for peers use it.
//   - The proxy's upstream watches (proxy) share one gRPC stream per
//     credentials, so they use the parts: a Silence per stream, and a
//     Position per watch, whose policy says when a watch is replaced and
//     from where (ReplaceFrom, at the stream's ReplaceAhead verdict),
//     where it opens again when compacted (Compacted) and which events it
//     repeats (Fresh). State uses the same methods. The one difference
//     is the stream's: on a shared stream a watch ahead of etcd keeps
//     every other watch's progress request unanswered, so the proxy
//     replaces it at once rather than letting it run on until the
//     replacement is synced (and, the replacement compacted, opens it
//     again as Compacted says).
//
// # The etcd quirks it absorbs
//
//   - A watch can hang without an error (a member stopped, cut off, a
//     wedged disk): only silence shows it. A stream quiet for half the
//     timeout is sent a progress request; one that stays quiet for the
//     whole timeout (its first request unanswered for half of it) is
//     Silent.
//   - etcd (3.6.8 and later) answers a progress request only once its
//     revision has reached the start of every watch on the stream. A watch
//     from the revision after a listing, on a key space nobody wrote to
//     since, starts ahead of etcd and is never answered: a healthy member
//     looks hung. Such a watch (Position.Ahead), once its progress request
//     went unanswered for an eighth of the timeout, is replaced by a watch
//     from the last revision etcd reported (Known), on a stream of its own.
//     The events the replacement repeats (below Next) are dropped. It is
//     not opened early from the start: etcd delivers the events of a watch
//     that starts in the past only from its next sync, up to 100 ms later.
//   - etcd creates a watch from a compacted revision and says it is
//     compacted only when it syncs it. So the replaced watch runs on until
//     etcd has synced the replacement (its first progress notification or
//     events), and stays if Known turns out compacted (other keys written,
//     then compacted: none of this watch's events are gone, and its start
//     is no longer ahead of etcd).
//   - A watch opened below Next whose start is later compacted lost only
//     revisions it had delivered (Position.CompactedBelowNext): it opens
//     again from Next, or from Known while Next is ahead of etcd
//     (Position.Compacted). Any other compaction loses events: a
//     *CompactedError with the first revision the watch still needed.
//
// # State machine
//
// State is a watch without its I/O (Run does the I/O). Its phases, and the
// method that is each transition:
//
//	          New(rev)
//	             |
//	             v          OnCompacted (below Next: Reopen(Compacted))
//	        +---------+ <-------------------------------------+
//	        | Opening |                                       |
//	        +---------+                                       |
//	             | Opened (clientv3's Watch returned)         |
//	             v                                            |
//	        +----------+ --------------------------------------+
//	 +----> | Watching |   Created / Progress / Fresh (events)
//	 |      +----------+   OnTick: Ask (quiet >= T/2)
//	 |           | OnTick: ReplaceAhead, Ahead()
//	 |           v
//	 |      +-----------+
//	 |      | Replacing | (replacement from Known requested;
//	 |      +-----------+  the current watch runs on)
//	 |           | OnReplacementCreated
//	 |           v
//	 |      +---------+  OnTick: AskReplacement (every tick)
//	 |      | Syncing |
//	 |      +---------+
//	 |        |     | OnReplacementCompacted: the current watch stays
//	 |        |     | (still Ahead: a new replacement, Replacing)
//	 +--------+-----+
//	   OnReplacementSynced: the replacement takes over (OpenedAt = Known)
//
//	In every phase: OnTick's Silent verdict (Silence, below) ends Run with
//	a *SilentError; OnCompacted above Next ends it with a *CompactedError.
//
// The silence check of one stream (Silence) is a state machine of its own,
// also used without State by the proxy, whose upstream watches share a
// stream:
//
//	   heard (Heard)           quiet >= T/2          asked T/8 ago
//	Listening ------------> Ask ------------> ReplaceAhead
//	    ^                    |  ^  asked T/4 ago     |
//	    |  Heard (answered)  |  +--------------------+
//	    +--------------------+
//	   the first ask of the spell unanswered for T/2 (so quiet >= T): Silent
//
// # Invariants (each pinned by a named test in state_test.go / watch_test.go)
//
//   - Every event below Next was delivered once, none at or above it.
//   - Known only grows; Next only grows.
//   - A watch from now (rev 0) starts after the revision of etcd's created
//     response.
//   - A replacement is opened only for a watch that is Ahead, once per
//     quiet spell, and never while another is in flight.
//   - A compacted replacement leaves the current watch in place.
//   - A compaction below Next reopens from Next (Known if Next is ahead);
//     any other ends the watch.
//   - Silent only after the whole timeout without a sign of life and a
//     progress request unanswered for half of it; time spent waiting for
//     the consumer is not silence.
package etcdwatch
