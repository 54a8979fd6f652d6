package proxy

import (
	"sync"
	"sync/atomic"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// What waits for all client watch streams together.
//
// Each stream bounds what waits for it (maxQueued, maxQueuedBytes: its
// events counted once per watcher they are for), but streams are many
// (Config.MaxStreams) and a response from etcd is shared by every stream
// it waits for, so the sum of the streams' bounds says nothing about the
// proxy's memory. The hub counts each batch once, while at least one
// stream holds it, queued or being written by the stream's sender:
// evBatch.holders counts the streams, metrics.watchWaiting the bytes of
// the batches held. When a batch takes that past
// Config.MaxWatchWaitingBytes, the streams that have waited longest are
// ended with ResourceExhausted, as a stream past its own bound is, until
// what waits fits again. How long a stream has waited is the place of
// the oldest batch it holds among all batches (its since, evBatch.seq):
// a stream that keeps up holds only what came since its sender last ran,
// so those that waited longest hold what the others were sent long ago.
// As a stream's own bound does, the bound judges by what already waits,
// never by the size of what comes: a stream holding nothing older than
// the batch that came is not ended for it, so what waits stays below the
// bound plus one batch.
//
// Invariants, each pinned by a test of watchwait_test.go: a batch counts
// once while any stream holds it, and not at all once none does (sent,
// or its streams ended, also while a sender still writes it); an ended
// stream holds nothing and is queued nothing; past the bound, streams are
// ended oldest first, only until what waits fits, and never for holding
// only the batch that came.

// hold counts b as held by one more stream.
func (h *watchHub) hold(b *evBatch) {
	if b.holders.Add(1) == 1 {
		h.p.m.watchWaiting.Add(int64(b.size))
	}
}

// release counts the batches of items as held by one stream fewer.
func (h *watchHub) release(items []qitem) {
	for _, it := range items {
		if it.b != nil && it.b.holders.Add(-1) == 0 {
			h.p.m.watchWaiting.Add(-int64(it.b.size))
		}
	}
}

// overWaiting reports whether what waits for the streams is past the
// proxy's bound.
func (h *watchHub) overWaiting() bool {
	limit := h.p.cfg.MaxWatchWaitingBytes
	return limit > 0 && h.p.m.watchWaiting.Load() > limit
}

// addStream and removeStream keep the streams shed chooses from.
func (h *watchHub) addStream(s *cstream) {
	h.cstreamsMu.Lock()
	defer h.cstreamsMu.Unlock()
	h.cstreams[s] = struct{}{}
}

func (h *watchHub) removeStream(s *cstream) {
	h.cstreamsMu.Lock()
	defer h.cstreamsMu.Unlock()
	delete(h.cstreams, s)
}

// shed ends the streams that have waited longest until what waits fits
// the bound, sparing those that hold nothing older than b, the batch that
// came (as a stream's own bound judges it by what already waits, never by
// the size of what comes): what waits stays below the bound plus one
// batch. One caller sheds at a time; the others go on (the one shedding
// reads waiting again after each stream it ends). It may be called with
// an upstream's mu held: lock order upstream.mu, shedMu, cstreamsMu,
// cstream.mu.
func (h *watchHub) shed(b *evBatch) {
	if !h.shedMu.TryLock() {
		return
	}
	defer h.shedMu.Unlock()
	for h.overWaiting() {
		s := h.longestWaiting(b.seq)
		if s == nil {
			return
		}
		if !s.end(status.Errorf(codes.ResourceExhausted,
			"proxy: watch stream ended to bound the proxy's memory: more than %s of events waited for its client watch streams together, and this one had waited longest; re-create the watches from the last revision received (or raise %s)",
			byteSize(int(h.p.cfg.MaxWatchWaitingBytes)), h.p.cfg.setting("proxy.Config.MaxWatchWaitingBytes"))) {
			return // being ended already, so holding nothing: not chosen, but never loop on it
		}
		h.p.m.watchShed.Inc()
	}
}

// longestWaiting is the stream that holds the batch made first, if that
// was made before batch before; nil if none does.
func (h *watchHub) longestWaiting(before uint64) *cstream {
	h.cstreamsMu.Lock()
	defer h.cstreamsMu.Unlock()
	var oldest *cstream
	var since uint64
	for s := range h.cstreams {
		s.mu.Lock()
		ss := s.since // 0 once s is being ended: it holds nothing
		s.mu.Unlock()
		if ss != 0 && ss < before && (oldest == nil || ss < since) {
			oldest, since = s, ss
		}
	}
	return oldest
}

// batchSeqs numbers the batches of every upstream, in the order they are
// made (evBatch.seq).
var batchSeqs atomic.Uint64

// waitState is the hub's part of what waits for the streams.
type waitState struct {
	shedMu     sync.Mutex // one shed at a time (TryLock)
	cstreamsMu sync.Mutex
	cstreams   map[*cstream]struct{}
}
