package etcdwatch

import (
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Position is what a watch knows of revisions. Its invariant: every event
// below Next was delivered, none at or above it was; the etcd watch that
// feeds it started at OpenedAt, which may be below Next (opened again from
// Known, so that etcd answers its progress requests: the events it
// repeats are dropped) or above Known (a watch "from the revision after a
// listing" on a key space nobody wrote to since: ahead of etcd).
type Position struct {
	Next     int64 // the first revision not yet delivered (0: "now", not known until etcd creates the watch)
	Known    int64 // the highest revision etcd reported
	OpenedAt int64 // the revision the feeding etcd watch started from (0: now)
}

// Reported records a revision etcd reported (a response header).
func (p *Position) Reported(rev int64) { p.Known = max(p.Known, rev) }

// Created records etcd's created response at rev: a watch from now starts
// after it.
func (p *Position) Created(rev int64) {
	p.Reported(rev)
	if p.Next == 0 {
		p.Next = rev + 1
	}
}

// Progress records a progress notification at rev: every event up to rev
// was delivered.
func (p *Position) Progress(rev int64) {
	p.Reported(rev)
	p.Next = max(p.Next, rev+1)
}

// Fresh returns the events of one response not delivered yet (those at or
// above Next, which it moves past them); header is the response's
// revision.
func (p *Position) Fresh(header int64, evs []*clientv3.Event) []*clientv3.Event {
	p.Reported(header)
	i := 0
	for i < len(evs) && evs[i].Kv.ModRevision < p.Next {
		i++ // delivered already (a watch opened below Next repeats them)
	}
	evs = evs[i:]
	if len(evs) > 0 {
		p.Next = evs[len(evs)-1].Kv.ModRevision + 1
	}
	return evs
}

// Ahead reports whether the feeding watch starts above the last revision
// etcd reported: etcd (3.6.8 and later) answers a progress request only
// once its revision has reached the start of every watch on the stream,
// so such a watch is never answered, and a healthy member looks hung.
func (p *Position) Ahead() bool { return p.OpenedAt > p.Known && p.Known > 0 }

// CompactedBelowNext reports whether a compaction at compactRev took only
// revisions below Next from a watch opened below Next: nothing still to
// deliver is gone, and a watch from Next has all it needs.
func (p *Position) CompactedBelowNext(compactRev int64) bool {
	return p.OpenedAt > 0 && p.OpenedAt < p.Next && compactRev <= p.Next
}

// ReplaceFrom is the replacement policy, asked at a ReplaceAhead verdict
// of the stream's Silence: a watch that is Ahead is opened again from
// Known, which etcd has reached, so that it answers the stream's progress
// requests (the events the new watch repeats, below Next, Fresh drops);
// it returns that revision, or 0 for a watch that is not Ahead and stays.
func (p *Position) ReplaceFrom() int64 {
	if p.Ahead() {
		return p.Known
	}
	return 0
}

// Compacted is the compaction fall-back of the watch that feeds p: etcd
// compacted its start at compactRev, in a response at revision header.
// When only revisions below Next are gone (CompactedBelowNext), it
// returns the revision to open the watch from again, and records it as
// OpenedAt: Next, or Known when a watch from Next would be ahead of etcd
// (it then repeats, and Fresh drops, what lies between). Otherwise the
// watch lost events: a *CompactedError.
func (p *Position) Compacted(compactRev, header int64) (from int64, err error) {
	p.Reported(header)
	if !p.CompactedBelowNext(compactRev) {
		return 0, &CompactedError{Requested: p.Next, CompactRevision: compactRev}
	}
	from = p.Next
	if p.Known > 0 && from > p.Known {
		from = p.Known
	}
	p.OpenedAt = from
	return from, nil
}

// CompactedError says that the revisions a watch needs are gone.
type CompactedError struct {
	Requested       int64 // the first revision the watch still needed
	CompactRevision int64 // etcd's compaction revision
}

func (e *CompactedError) Error() string {
	return fmt.Sprintf("etcd watch: revision %d compacted (etcd kept from %d)", e.Requested, e.CompactRevision)
}
