package proxy

import (
	"context"
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The bound on what waits for all client watch streams (watchwait.go),
// in memory: bare streams (no sender runs; the test sends with flush) of
// one hub, and batches queued to them as fanOut queues them.

// queueTo queues b for one watcher of s, as fanOut does.
func queueTo(s *cstream, b *evBatch) {
	fan := (*fanLists.Get().(*[]fanItem))[:0]
	s.enqueueEvents(b, append(fan, fanItem{from: b.last, id: 1}), 0)
}

// waiting is what the hub counts as waiting for its streams.
func waiting(r *hubRig) int64 { return r.h.p.m.watchWaiting.Load() }

// ending reports whether s is being ended.
func ending(s *cstream) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.overflow
}

// TestWaitingCountsABatchOnceWhileAnyStreamHoldsIt: a batch queued for
// two streams counts once, as long as either still holds it; a stream
// lets go of it when its sender has sent it, when it is ended as slow,
// and when it ends.
func TestWaitingCountsABatchOnceWhileAnyStreamHoldsIt(t *testing.T) {
	r := newHubRig(t, 0)
	a, b := r.bareStream(), r.bareStream()
	b1 := batchAt(1, 1000)
	queueTo(a, b1)
	queueTo(b, b1)
	if got := waiting(r); got != int64(b1.size) {
		t.Fatalf("one batch queued for two streams: waiting %d, want its size %d once", got, b1.size)
	}
	sendQueued(t, a)
	if got := waiting(r); got != int64(b1.size) {
		t.Fatalf("sent by one stream, still queued for the other: waiting %d, want %d", got, b1.size)
	}
	sendQueued(t, b)
	if got := waiting(r); got != 0 {
		t.Fatalf("sent by both: waiting %d, want 0", got)
	}

	b2, b3 := batchAt(2, 500), batchAt(3, 700)
	queueTo(a, b2)
	queueTo(a, b3)
	queueTo(b, b3)
	if got, want := waiting(r), int64(b2.size+b3.size); got != want {
		t.Fatalf("two batches, one of them for both streams: waiting %d, want %d", got, want)
	}
	a.overflowed()
	if got, want := waiting(r), int64(b3.size); got != want {
		t.Fatalf("a ended as slow: waiting %d, want what b still holds, %d", got, want)
	}
	b.detachAll() // b's stream ends
	if got := waiting(r); got != 0 {
		t.Fatalf("both streams ended: waiting %d, want 0", got)
	}
	queueTo(b, batchAt(4, 100))
	if got := waiting(r); got != 0 {
		t.Fatalf("a batch for an ended stream: waiting %d, want 0 (nothing is queued for it)", got)
	}
}

// TestWaitingLetsGoOfTheBatchBeingSentWhenTheStreamEnds: a stream ended
// while its sender writes (the client stopped reading) lets go of that
// batch at once, and the sender, when its write fails, lets go of
// nothing twice.
func TestWaitingLetsGoOfTheBatchBeingSentWhenTheStreamEnds(t *testing.T) {
	r := newHubRig(t, 0)
	s, also := r.bareStream(), r.bareStream() // also holds b1 too, until it is ended
	b1 := batchAt(1, 1000)
	queueTo(s, b1)
	queueTo(also, b1)
	rec := s.ss.(*recStream)
	rec.held.Hold() // the client reads nothing: the write waits
	flushed := make(chan error, 1)
	go func() {
		var sn sender
		flushed <- s.flush(&sn)
	}()
	eventually(t, "the sender took the batch", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.sending) == 1
	})
	if got := waiting(r); got != int64(b1.size) {
		t.Fatalf("batch being sent: waiting %d, want %d", got, b1.size)
	}
	also.overflowed()
	if got := waiting(r); got != int64(b1.size) {
		t.Fatalf("one of two streams ended: waiting %d, want %d", got, b1.size)
	}
	queueTo(also, b1) // ended: not queued, not counted
	s.overflowed()
	if got := waiting(r); got != 0 {
		t.Fatalf("stream ended while its sender writes: waiting %d, want 0 at once", got)
	}
	if err := <-flushed; !errors.Is(err, context.Canceled) {
		t.Fatalf("the write to the ended stream: %v, want its context's end", err)
	}
	if got := waiting(r); got != 0 {
		t.Fatalf("after the sender finished: waiting %d, want 0", got)
	}
	queueTo(r.bareStream(), b1) // counted again: no stream let go of it twice
	if got, want := waiting(r), int64(b1.size); got != want {
		t.Fatalf("the sent batch queued again: waiting %d, want %d", got, want)
	}
}

// TestShedEndsTheStreamsThatWaitedLongest: past the proxy's bound, the
// stream holding the batch queued first is ended (ResourceExhausted,
// naming the bound), then the next, until what waits fits; a stream that
// keeps up is not ended, however much it was sent.
func TestShedEndsTheStreamsThatWaitedLongest(t *testing.T) {
	r := newHubRig(t, 0)
	slow, slower, keepsUp := r.bareStream(), r.bareStream(), r.bareStream()
	queueTo(keepsUp, batchAt(1, 1000)) // the first batch, sent
	sendQueued(t, keepsUp)
	b1 := batchAt(1, 1000)
	r.h.p.cfg.MaxWatchWaitingBytes = int64(3 * b1.size) // three batches fit
	queueTo(slower, b1)
	for rev := range int64(2) {
		b := batchAt(rev+2, 1000)
		queueTo(slow, b)
		queueTo(keepsUp, b)
		sendQueued(t, keepsUp)
	}
	if over := ending(slower); over {
		t.Fatal("ended within the bound")
	}
	queueTo(keepsUp, batchAt(4, 1000)) // four batches wait: one too many
	if over := ending(slower); !over {
		t.Fatal("past the bound, the stream that waited longest was not ended")
	}
	if cause := context.Cause(slower.ctx); status.Code(cause) != codes.ResourceExhausted || !strings.Contains(cause.Error(), "MaxWatchWaitingBytes") {
		t.Errorf("ended with %v, want ResourceExhausted naming the bound", cause)
	}
	for _, s := range []*cstream{slow, keepsUp} {
		if over := ending(s); over {
			t.Fatal("a stream ended though what waits fit once the longest waiting one was")
		}
	}
	if got := value(t, r.h.p.m.watchShed); got != 1 {
		t.Errorf("watch_shed_streams_total %v, want 1", got)
	}
	queueTo(keepsUp, batchAt(5, 1000))
	queueTo(keepsUp, batchAt(6, 1000))
	if over := ending(slow); !over {
		t.Fatal("past the bound again: the stream that waited longest (holding revisions 2 and 3) was not ended")
	}
	if over := ending(keepsUp); over {
		t.Fatal("the stream holding only what came last was ended")
	}
	if got, limit := waiting(r), r.h.p.cfg.MaxWatchWaitingBytes; got > limit {
		t.Errorf("after shedding: waiting %d, past the bound %d", got, limit)
	}
}

// TestShedNeverWithoutBound: with no bound (negative), nothing is shed.
func TestShedNeverWithoutBound(t *testing.T) {
	r := newHubRig(t, 0)
	r.h.p.cfg.MaxWatchWaitingBytes = -1
	s := r.bareStream()
	for rev := range int64(100) {
		queueTo(s, batchAt(rev+1, 1000))
	}
	if over := ending(s); over {
		t.Fatal("a stream was ended with no bound on what waits")
	}
}

// TestShedLooksAtTheOldestBatchAStreamHolds: a stream that holds the
// oldest batch is the one that waited longest, whatever came for it
// since.
func TestShedLooksAtTheOldestBatchAStreamHolds(t *testing.T) {
	r := newHubRig(t, 0)
	b1 := batchAt(1, 1000)
	r.h.p.cfg.MaxWatchWaitingBytes = int64(2 * b1.size)
	x, y := r.bareStream(), r.bareStream()
	queueTo(x, b1)
	queueTo(y, batchAt(2, 1000))
	queueTo(x, batchAt(3, 1000))
	if !ending(x) || ending(y) {
		t.Fatalf("x holds revisions 1 and 3, y 2: ended x %v, y %v; want x alone", ending(x), ending(y))
	}
}

// TestShedEndsAsManyStreamsAsItTakes: one batch that takes what waits
// past the bound by more than a stream holds ends as many streams,
// longest waiting first, as it takes to fit.
func TestShedEndsAsManyStreamsAsItTakes(t *testing.T) {
	r := newHubRig(t, 0)
	b1 := batchAt(1, 1000)
	r.h.p.cfg.MaxWatchWaitingBytes = int64(3*b1.size + 100)
	a, b, c := r.bareStream(), r.bareStream(), r.bareStream()
	queueTo(a, b1)
	queueTo(b, batchAt(2, 1000))
	queueTo(c, batchAt(3, 3000)) // five of b1's size wait: a and b must go
	if !ending(a) || !ending(b) || ending(c) {
		t.Fatalf("ended a %v, b %v, c %v; want a and b", ending(a), ending(b), ending(c))
	}
}

// TestShedSparesTheBatchThatCame: a batch larger than the bound on its
// own ends the streams holding older ones, not those it was queued for
// that hold nothing older, whichever of them it reached first.
func TestShedSparesTheBatchThatCame(t *testing.T) {
	r := newHubRig(t, 0)
	older, first, second := r.bareStream(), r.bareStream(), r.bareStream()
	queueTo(older, batchAt(1, 100))
	big := batchAt(2, 5000)
	r.h.p.cfg.MaxWatchWaitingBytes = int64(big.size / 2)
	queueTo(first, big)
	queueTo(second, big)
	if !ending(older) || ending(first) || ending(second) {
		t.Fatalf("ended older %v, first %v, second %v; want the one holding an older batch alone", ending(older), ending(first), ending(second))
	}
	if got := waiting(r); got != int64(big.size) {
		t.Fatalf("waiting %d, want the one batch that came, %d", got, big.size)
	}
}
