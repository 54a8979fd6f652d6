package nats

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/internal/mvcc"
	"github.com/nats-io/nats.go/jetstream"
)

// maxHold bounds how long a watch holds events to batch them.
const maxHold = 2 * time.Millisecond

// maxTracked bounds the per-watch map of each key's last message, used to
// detect history a watch needs but the bucket no longer has.
const maxTracked = 1 << 17

// Watch implements store.Watcher with an ordered consumer on the key
// subjects under prefix and on the lease subjects, starting at the
// requested revision (a stream sequence).
//
// A watch ends with a *store.CompactedError when the history it needs is
// gone: the revision is below the bucket's compaction watermark; a key's
// earlier message was dropped by the per-key history limit (every write
// names its predecessor, so the gap is seen); or the watch starts (or falls
// behind) further back than the marker TTL and a lease that keys under the
// prefix are bound to has ended with its marker already gone (so the
// revision of their deletion is unknown).
func (s *Store) Watch(ctx context.Context, prefix string, fromRevision int64) store.WatchChan {
	if err := mvcc.CheckWatch(prefix, fromRevision); err != nil {
		return mvcc.Failed(err)
	}
	if err := s.begin(ctx); err != nil {
		return mvcc.Failed(err)
	}
	// Pin the start now, so that a watch "from now" sees every write made
	// after Watch returns.
	msgs, now, err := s.multiLast(ctx, []string{s.metaSubject(), s.compactSubject()}, 0)
	if err != nil {
		return mvcc.Failed(err)
	}
	var watermark int64 = 1
	for i := range msgs {
		if msgs[i].subject == s.compactSubject() {
			watermark, _ = strconv.ParseInt(string(msgs[i].data), 10, 64)
		}
	}
	from := uint64(fromRevision)
	if from == 0 {
		from = now + 1
	}
	if int64(from) < watermark {
		return mvcc.Failed(&store.CompactedError{Requested: int64(from), CompactRevision: watermark})
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return mvcc.Failed(store.ErrClosed)
	}
	s.wg.Add(1)
	s.mu.Unlock()
	ch := make(chan store.WatchResponse, 1)
	go s.watch(ctx, ch, prefix, from, now)
	return ch
}

func (s *Store) retention() time.Duration { return s.markerTTL * 3 / 4 }

type watcher struct {
	s       *Store
	prefix  string
	filter  string // key subject filter of prefix
	exact   bool
	from    uint64
	last    map[string]uint64 // key → its last message seen by this watch
	live    map[string]bool   // key → whether this watch has it existing
	pruned  uint64            // last keys of deleted keys below this were dropped
	pending []store.Event
	// delivered is the consumer's sequence of the last message read: the
	// next must follow it.
	delivered uint64

	// caughtUp is when the watch last had nothing pending. Lease-end
	// markers written since then live for the marker TTL, so the watch must
	// not fall further behind than the retention window.
	caughtUp     time.Time
	behind       bool      // the consumer has more messages pending
	pendingSince time.Time // when the oldest pending event was read
	skipUntil    uint64    // the last message of a transaction read ahead
	backfilled   bool      // only the first message can start inside one
}

func (s *Store) watch(parent context.Context, ch chan<- store.WatchResponse, prefix string, from, now uint64) {
	defer s.wg.Done()
	defer close(ch)
	ctx, cancel := context.WithCancelCause(parent)
	silent := make(chan struct{})
	go func() {
		defer close(silent)
		s.endSilentWatch(ctx, cancel)
	}()
	defer func() {
		cancel(nil)
		<-silent
	}()
	defer func() {
		// Lost connection: the last response says so (not on cancel or
		// Close, which just close the channel).
		if err := context.Cause(ctx); errors.Is(err, store.ErrUnavailable) {
			select {
			case ch <- store.WatchResponse{Err: err}:
			case <-parent.Done():
			case <-s.done:
			}
		}
	}()
	send := func(resp store.WatchResponse) bool {
		select {
		case ch <- resp:
			return true
		case <-ctx.Done():
			return false
		}
	}
	fail := func(err error) {
		if err != nil && ctx.Err() == nil {
			send(store.WatchResponse{Err: err})
		}
	}
	filter, exact := prefixFilter(prefix)
	w := &watcher{s: s, prefix: prefix, filter: s.pre + "k." + filter, exact: exact, from: from, last: map[string]uint64{}, live: map[string]bool{}}
	if err := w.checkRetention(ctx, now); err != nil {
		fail(err)
		return
	}
	it, stop, err := s.consume(ctx, w.filter, from)
	if err != nil {
		fail(err)
		return
	}
	defer stop()
	fail(w.follow(ctx, it, send))
}

// endSilentWatch ends the watch on Close, and when the connection has been
// down longer than the request timeout: a watch never goes silent. It
// returns when ctx ends.
func (s *Store) endSilentWatch(ctx context.Context, cancel context.CancelCauseFunc) {
	tick := time.NewTicker(s.cfg.RequestTimeout / 4)
	defer tick.Stop()
	var down time.Time
	for {
		select {
		case <-s.done:
			cancel(store.ErrClosed)
			return
		case <-ctx.Done():
			return
		case <-tick.C:
			switch {
			case s.nc.IsConnected():
				down = time.Time{}
			case down.IsZero():
				down = time.Now()
			case time.Since(down) > s.cfg.RequestTimeout:
				cancel(fmt.Errorf("%w: nats: watch: disconnected from the server for %v", store.ErrUnavailable, time.Since(down).Round(time.Millisecond)))
				return
			}
		}
	}
}

// consume creates a consumer of the key subjects of filter and of the
// lease subjects, from stream sequence from, and returns its messages and
// stop, which ends them and has the server delete the consumer.
//
// It is not jetstream's ordered consumer: after any failure that one
// re-creates itself in a loop of its own, with requests bounded by no
// context of ours and retried forever, so a watch, and Close waiting for
// it, hung as long as the server did not answer or the bucket was gone.
// Here the one request is bounded by ctx (which Close ends) and the request
// timeout, and any failure of the messages ends the watch, whose client
// lists again.
func (s *Store) consume(ctx context.Context, filter string, from uint64) (jetstream.MessagesContext, func(), error) {
	rctx, cancel := s.reqCtx(ctx)
	defer cancel()
	cons, err := s.js.CreateConsumer(rctx, s.stream, jetstream.ConsumerConfig{
		FilterSubjects: []string{filter, s.pre + "l.>"},
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:    from,
		AckPolicy:      jetstream.AckNonePolicy,
		// Pull requests keep it alive; this bounds how long the consumer
		// of a process that vanished stays on the server.
		InactiveThreshold: max(time.Minute, 2*s.cfg.RequestTimeout),
		MemoryStorage:     true,
		Replicas:          1,
	})
	if err != nil {
		return nil, nil, s.fail(ctx, "watch", err)
	}
	// A consumer the server lost (a restart) sends no heartbeats: the
	// watch ends after two missed ones rather than waiting in silence.
	hb := min(max(s.cfg.RequestTimeout/2, 500*time.Millisecond), 15*time.Second)
	it, err := cons.Messages(jetstream.PullHeartbeat(hb), jetstream.WithMessagesErrOnMissingHeartbeat(true))
	if err != nil {
		s.deleteConsumer(cons.CachedInfo().Name)
		return nil, nil, s.fail(ctx, "watch", err)
	}
	return it, func() {
		it.Stop()
		s.deleteConsumer(cons.CachedInfo().Name)
	}, nil
}

// deleteConsumer asks the server to delete a consumer now rather than when
// it is idle, without waiting for the answer (Close must not wait for the
// server); Close flushes the request with the connection.
func (s *Store) deleteConsumer(name string) {
	_ = s.nc.Publish(s.api+".CONSUMER.DELETE."+s.stream+"."+name, nil)
}

// follow turns the consumer's messages into responses until ctx ends
// (nil) or something fails (the error, the watch's last response).
func (w *watcher) follow(ctx context.Context, it jetstream.MessagesContext, send func(store.WatchResponse) bool) error {
	w.caughtUp = time.Now()
	for {
		msg, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return w.s.fail(ctx, "watch", err)
		}
		flush, err := w.step(ctx, msg)
		if err != nil {
			return err
		}
		if !flush {
			continue
		}
		if !send(store.WatchResponse{Events: w.pending}) {
			return nil
		}
		w.pending, w.pendingSince = nil, time.Time{}
	}
}

// step handles one message of the consumer and reports whether the
// pending events are to go out now.
func (w *watcher) step(ctx context.Context, msg jetstream.Msg) (bool, error) {
	meta, err := msg.Metadata()
	if err != nil {
		return false, fmt.Errorf("nats: watch: %w", err)
	}
	if meta.Sequence.Consumer != w.delivered+1 {
		// The client dropped messages (it fell behind): the watch cannot
		// go on without a gap.
		return false, fmt.Errorf("%w: nats: watch: messages %d to %d of its consumer were lost", store.ErrUnavailable, w.delivered+1, meta.Sequence.Consumer-1)
	}
	w.delivered = meta.Sequence.Consumer
	if w.behind && time.Since(w.caughtUp) > w.s.retention() {
		// Lease-end markers may have expired before this watch got to
		// them: make sure none that matters did.
		if err := w.verifyLeases(ctx, meta.Sequence.Stream); err != nil {
			return false, err
		}
		w.caughtUp = time.Now()
	}
	m := rawMsg{subject: msg.Subject(), seq: meta.Sequence.Stream, time: meta.Timestamp, header: msg.Headers(), data: msg.Data()}
	if err := w.take(ctx, &m); err != nil {
		return false, err
	}
	w.behind = meta.NumPending > 0
	if !w.behind {
		w.caughtUp = time.Now()
	}
	if len(w.pending) > 0 && w.pendingSince.IsZero() {
		w.pendingSince = time.Now()
	}
	// Batch while more is pending, but never hold an event long: other
	// clients' keep-alives may keep something pending all the time.
	return len(w.pending) > 0 && (!w.behind || len(w.pending) >= mvcc.MaxBatch || time.Since(w.pendingSince) > maxHold), nil
}

// take handles message m with the rest of its transaction, and for the
// watch's first message the part of its transaction before the start.
func (w *watcher) take(ctx context.Context, m *rawMsg) error {
	i, n := batchPos(m)
	if m.seq <= w.skipUntil {
		i, n = 0, 0 // read already, with the rest of its transaction
	}
	if n > 1 && !w.backfilled {
		if first := m.seq - uint64(i-1); first < w.from {
			// The watch starts inside a transaction: read its earlier
			// messages too.
			if err := w.readRange(ctx, first, w.from-1); err != nil {
				return err
			}
		}
	}
	w.backfilled = true
	if m.seq > w.skipUntil {
		if err := w.handle(ctx, m); err != nil {
			return err
		}
	}
	if i < n {
		// A transaction is one revision and goes out in one response: read
		// the rest of it now (a direct get waits until the whole batch is
		// stored).
		w.skipUntil = m.seq + uint64(n-i)
		return w.readRange(ctx, m.seq+1, w.skipUntil)
	}
	return nil
}

// readRange handles the messages from..to (inclusive) of a transaction,
// read directly rather than through the consumer.
func (w *watcher) readRange(ctx context.Context, from, to uint64) error {
	for seq := from; seq <= to; seq++ {
		m, err := w.s.bySeq(ctx, seq)
		if err != nil {
			return err
		}
		if m != nil {
			if err := w.handle(ctx, m); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkRetention verifies the leases when the start revision is older than
// the markers of lease ends live.
func (w *watcher) checkRetention(ctx context.Context, now uint64) error {
	if w.from > now {
		return nil
	}
	first, err := w.s.firstSince(ctx, time.Now().Add(-w.s.retention()))
	if err != nil {
		return err
	}
	if first != nil && first.seq <= w.from {
		return nil
	}
	return w.verifyLeases(ctx, now+1)
}

// verifyLeases fails if a key under the prefix is bound to a lease whose
// subject is empty: the lease ended, and the marker that said when is gone.
func (w *watcher) verifyLeases(ctx context.Context, at uint64) error {
	msgs, _, err := w.s.snapshotAt(ctx, w.prefix, 0)
	if err != nil {
		return err
	}
	ids := map[store.LeaseID]bool{}
	for i := range msgs {
		if !isEnd(msgs[i].header) {
			if id := parseLeaseID(msgs[i].header.Get(hdrLease)); id != store.NoLease {
				ids[id] = true
			}
		}
	}
	if len(ids) == 0 {
		return nil
	}
	seen := map[store.LeaseID]bool{}
	subjects := make([]string, 0, len(ids))
	for id := range ids {
		subjects = append(subjects, w.s.leaseSubject(id))
	}
	for len(subjects) > 0 {
		n := min(len(subjects), 1000)
		part, _, err := w.s.multiLast(ctx, append(subjects[:n:n], w.s.metaSubject()), 0)
		if err != nil {
			return err
		}
		for i := range part {
			if hex, ok := strings.CutPrefix(part[i].subject, w.s.pre+"l."); ok {
				seen[parseLeaseID(hex)] = true
			}
		}
		subjects = subjects[n:]
	}
	for id := range ids {
		if !seen[id] {
			return &store.CompactedError{Requested: int64(w.from), CompactRevision: int64(at)}
		}
	}
	return nil
}

// handle turns one stream message into events.
func (w *watcher) handle(ctx context.Context, m *rawMsg) error {
	s := w.s
	if hex, ok := strings.CutPrefix(m.subject, s.pre+"l."); ok {
		if !isEnd(m.header) {
			return nil // grant, keep-alive or write touching the lease
		}
		return w.leaseEnded(ctx, parseLeaseID(hex), m.seq)
	}
	tokens, ok := strings.CutPrefix(m.subject, s.pre+"k.")
	if !ok {
		return nil
	}
	key, err := decodeKey(tokens)
	if err != nil || !strings.HasPrefix(key, w.prefix) {
		return nil
	}
	// Every write names the key's previous message: one at or after the
	// watch's start that this watch did not see was dropped.
	if p := m.header.Get(hdrPrev); p != "" {
		prev, _ := strconv.ParseUint(p, 10, 64)
		if seen, ok := w.last[key]; prev >= w.from && (!ok || seen != prev) {
			return &store.CompactedError{Requested: int64(prev), CompactRevision: int64(m.seq)}
		}
	}
	w.track(key, m.seq, isEnd(m.header))
	switch {
	case m.header.Get(hdrReap) != "":
		// The key went when its lease ended; this watch saw that, unless
		// the lease-end marker expired before it got there.
		if w.live[key] {
			return &store.CompactedError{Requested: int64(w.from), CompactRevision: int64(m.seq)}
		}
		return nil
	case isEnd(m.header):
		w.live[key] = false
		w.pending = append(w.pending, store.Event{Type: store.EventDelete, KV: store.KeyValue{Key: key, ModRevision: logicalRev(m)}})
		return nil
	}
	if m.header.Get(hdrCreate) == "" && w.live[key] {
		// A creation of a key this watch has existing: its deletion (by
		// a lease end whose marker expired) was missed.
		return &store.CompactedError{Requested: int64(w.from), CompactRevision: int64(m.seq)}
	}
	w.live[key] = true
	w.pending = append(w.pending, store.Event{Type: store.EventPut, KV: decodeKV(key, m)})
	return nil
}

func (w *watcher) track(key string, seq uint64, deleted bool) {
	w.last[key] = seq
	if len(w.last) <= maxTracked || !deleted {
		return
	}
	// Forget deleted keys; a later write naming one of them as its
	// predecessor is then taken as a gap (a false, safe compaction).
	for k, v := range w.last {
		if v < seq && !w.live[k] {
			delete(w.last, k)
			delete(w.live, k)
		}
	}
	w.pruned = seq
}

// leaseEnded emits, at the lease-end revision, the deletion of every key
// under the prefix that was bound to the lease just before it.
func (w *watcher) leaseEnded(ctx context.Context, id store.LeaseID, seq uint64) error {
	msgs, _, err := w.s.snapshotAt(ctx, w.prefix, seq-1)
	if err != nil {
		return err
	}
	dead := map[string]bool{}
	var reap []store.KeyValue
	phys := map[string]uint64{}
	for i := range msgs {
		m := &msgs[i]
		tokens, ok := strings.CutPrefix(m.subject, w.s.pre+"k.")
		if !ok || isEnd(m.header) || parseLeaseID(m.header.Get(hdrLease)) != id {
			continue
		}
		if key, err := decodeKey(tokens); err == nil && strings.HasPrefix(key, w.prefix) {
			dead[key] = true
			reap = append(reap, store.KeyValue{Key: key, Lease: id})
			phys[key] = m.seq
		}
	}
	// Free the keys' messages (every watch of them tries; one wins).
	w.s.reapLater(reap, phys)
	for _, key := range sortKeys(dead) {
		w.live[key] = false
		w.pending = append(w.pending, store.Event{Type: store.EventDelete, KV: store.KeyValue{Key: key, ModRevision: int64(seq)}})
	}
	return nil
}
