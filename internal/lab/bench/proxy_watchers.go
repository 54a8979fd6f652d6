package bench

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// The proxy scenario's watchers are raw etcd watch streams, many watches
// on each, spoken over bare HTTP/2 (proxy_h2.go), whose responses are
// read field by field into one reused message per stream: the
// benchmark's process records a count and a timestamp per event and
// nothing else. With clientv3 (a goroutine, a decoded response and two
// channel hops per watch and event) the benchmark's own decoding, not the
// server measured, bounded delivery at 100,000 watchers on two cores; a
// gRPC client stream read the same way still took a third of the
// machine's CPU at 500,000 events/s. Every side gets the same watchers.

// watchCreateTimeout bounds the wait for one watch's "created" answer.
const watchCreateTimeout = 30 * time.Second

// watchMsg is what the benchmark reads of a WatchResponse (etcd's
// api/etcdserverpb/rpc.proto and mvccpb/kv.proto field numbers).
type watchMsg struct {
	id                int64
	created, canceled bool
	reason            string
	events            int   // events that are not latency samples
	samples           []int // the latency samples' numbers ("l<k>" values)
}

func (m *watchMsg) parse(b []byte) error {
	m.id, m.created, m.canceled, m.reason, m.events, m.samples = 0, false, false, "", 0, m.samples[:0]
	return eachField(b, func(num protowire.Number, v uint64, field []byte) error {
		switch num {
		case 2:
			m.id = int64(v)
		case 3:
			m.created = v != 0
		case 4:
			m.canceled = v != 0
		case 6:
			m.reason = string(field)
		case 11:
			return m.event(field)
		}
		return nil
	})
}

// event reads an mvccpb.Event: its kv (2), the kv's value (5).
func (m *watchMsg) event(b []byte) error {
	var value []byte
	err := eachField(b, func(num protowire.Number, _ uint64, field []byte) error {
		if num != 2 {
			return nil
		}
		return eachField(field, func(num protowire.Number, _ uint64, field []byte) error {
			if num == 5 {
				value = field
			}
			return nil
		})
	})
	if err != nil {
		return err
	}
	if k, ok := sampleNumber(value); ok {
		m.samples = append(m.samples, k)
	} else {
		m.events++
	}
	return nil
}

// sampleNumber reads k from a latency sample's value "l<k>".
func sampleNumber(v []byte) (int, bool) {
	if len(v) < 2 || v[0] != 'l' {
		return 0, false
	}
	k := 0
	for _, c := range v[1:] {
		if c < '0' || c > '9' || k > 1<<30 {
			return 0, false
		}
		k = k*10 + int(c-'0')
	}
	return k, true
}

// eachField calls f with every field of the protobuf message b: a
// varint's value, or a length-delimited field's bytes (fixed-width
// fields are skipped).
func eachField(b []byte, f func(num protowire.Number, v uint64, field []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		var err error
		switch typ {
		case protowire.VarintType:
			var v uint64
			v, n = protowire.ConsumeVarint(b)
			if n >= 0 {
				err = f(num, v, nil)
			}
		case protowire.BytesType:
			var field []byte
			field, n = protowire.ConsumeBytes(b)
			if n >= 0 {
				err = f(num, 0, field)
			}
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return protowire.ParseError(n)
		}
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// rawWatchStream is one connection and watch stream of a round's
// watchers: it opens its watchers one after the other, each waiting for
// its "created" answer (as etcd's client does on a stream), and its
// receiver counts what each gets.
type rawWatchStream struct {
	w       *proxyWatchRound
	h2      *h2Watch
	mine    []int      // the round's watcher numbers on this stream, in the order created
	created chan error // the receiver's answer to each create
	// The receiver's own: how many creates were answered, and which
	// watcher each watch ID is (-1: none, or ended), in a slice for the
	// small IDs servers give (0, 1, 2, ... per stream), a map beyond.
	answered int
	byID     []int32
	ids      map[int64]int
}

// dialWatchStream opens a watch stream to endpoint for the watchers mine.
func dialWatchStream(ctx context.Context, w *proxyWatchRound, endpoint string, mine []int) (*rawWatchStream, error) {
	h2, err := dialH2Watch(ctx, strings.TrimPrefix(endpoint, "http://"))
	if err != nil {
		return nil, err
	}
	context.AfterFunc(ctx, func() { _ = h2.close() }) // the receiver's end
	return &rawWatchStream{w: w, h2: h2, mine: mine, created: make(chan error, 1), ids: map[int64]int{}}, nil
}

// open creates the stream's watches of key, one at a time.
func (s *rawWatchStream) open(ctx context.Context, key string) error {
	req, err := proto.Marshal(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: &pb.WatchCreateRequest{Key: []byte(key)}}})
	if err != nil {
		return err
	}
	timer := time.NewTimer(watchCreateTimeout)
	defer timer.Stop()
	for _, i := range s.mine {
		if err := s.h2.send(req); err != nil {
			return fmt.Errorf("watch %d: %w", i, err)
		}
		timer.Reset(watchCreateTimeout)
		select {
		case err := <-s.created:
			if err != nil {
				return fmt.Errorf("watch %d: %w", i, err)
			}
		case <-timer.C:
			return fmt.Errorf("watch %d: not created within %v", i, watchCreateTimeout)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// receive reads the stream until it ends, recording every event; each
// watch that ends (canceled, or the stream's end) counts in w.ended.
func (s *rawWatchStream) receive() {
	w := s.w
	live := 0
	defer func() { w.ended.Add(int64(live)) }()
	var m watchMsg
	err := s.h2.read(func(b []byte) error {
		if err := m.parse(b); err != nil {
			return err
		}
		live += s.handle(&m)
		return nil
	})
	select { // an opener still waiting
	case s.created <- fmt.Errorf("watch stream ended: %w", err):
	default:
	}
}

// handle handles one response; it returns the change in the stream's
// live watches.
func (s *rawWatchStream) handle(m *watchMsg) int {
	switch {
	case m.created && s.answered < len(s.mine):
		s.answered++
		if m.canceled {
			s.created <- fmt.Errorf("refused: %s", m.reason)
			return 0
		}
		s.setWatcher(m.id, s.mine[s.answered-1])
		s.created <- nil
		return 1
	case m.canceled:
		if _, ok := s.watcher(m.id); ok {
			s.setWatcher(m.id, -1)
			s.w.ended.Add(1)
			return -1
		}
	default:
		s.record(m)
	}
	return 0
}

// record counts m's events for the watcher it is for.
func (s *rawWatchStream) record(m *watchMsg) {
	w := s.w
	if m.events > 0 {
		w.got.Add(int64(m.events))
		w.lastNanos.Store(time.Now().UnixNano())
	}
	if len(m.samples) == 0 {
		return
	}
	if i, ok := s.watcher(m.id); ok {
		for _, k := range m.samples {
			w.lat.got(k, i)
		}
	}
}

// openRawWatchers opens w.cfg.Watches watches of w.key over
// w.cfg.Streams streams, stream c to endpoints[c % len(endpoints)] and
// watch i on stream i % streams, the streams creating at once. The
// receivers run in wg until ctx ends; close closes the connections.
func openRawWatchers(ctx context.Context, w *proxyWatchRound, wg *sync.WaitGroup, endpoints []string) (close func(), err error) {
	n, ns := w.cfg.Watches, w.cfg.Streams
	streams := make([]*rawWatchStream, 0, ns)
	close = func() {
		for _, s := range streams {
			_ = s.h2.close()
		}
	}
	for c := range ns {
		var mine []int
		for i := c; i < n; i += ns {
			mine = append(mine, i)
		}
		s, err := dialWatchStream(ctx, w, endpoints[c%len(endpoints)], mine)
		if err != nil {
			return close, err
		}
		streams = append(streams, s)
		wg.Go(s.receive)
	}
	errs := make(chan error, len(streams))
	for _, s := range streams {
		go func() { errs <- s.open(ctx, w.key) }()
	}
	var all []error
	for range streams {
		all = append(all, <-errs)
	}
	return close, errors.Join(all...)
}

// watcher returns the watcher that watch ID id is, if it is open.
func (s *rawWatchStream) watcher(id int64) (int, bool) {
	if id >= 0 && id < int64(len(s.byID)) {
		i := s.byID[id]
		return int(i), i >= 0
	}
	i, ok := s.ids[id]
	return i, ok && i >= 0
}

// setWatcher records that watch ID id is watcher i (-1: none).
func (s *rawWatchStream) setWatcher(id int64, i int) {
	if id < 0 || id >= int64(2*len(s.mine)+64) {
		s.ids[id] = i
		return
	}
	for int64(len(s.byID)) <= id {
		s.byID = append(s.byID, -1)
	}
	s.byID[id] = int32(i)
}
