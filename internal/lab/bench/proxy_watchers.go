package bench

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// The proxy scenario's watchers are raw etcd watch streams, many watches
// on each, whose responses are read field by field into one reused
// message per stream: the benchmark's process records a count and a
// timestamp per event and nothing else. With clientv3 (a goroutine, a
// decoded response and two channel hops per watch and event) the
// benchmark's own decoding, not the server measured, bounded delivery at
// 100,000 watchers on two cores. Every side gets the same watchers.

// watchCreateTimeout bounds the wait for one watch's "created" answer.
const watchCreateTimeout = 30 * time.Second

// watchCodec sends WatchRequests as protobuf and reads WatchResponses
// into a *watchMsg, field by field, without building etcd's message.
type watchCodec struct{}

func (watchCodec) Name() string { return "proto" } // the content subtype servers expect

func (watchCodec) Marshal(v any) (mem.BufferSlice, error) {
	req, ok := v.(*pb.WatchRequest)
	if !ok {
		return nil, fmt.Errorf("bench: watch codec: cannot marshal %T", v)
	}
	b, err := proto.Marshal(req)
	if err != nil {
		return nil, err
	}
	return mem.BufferSlice{mem.SliceBuffer(b)}, nil
}

func (watchCodec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(*watchMsg)
	if !ok {
		return fmt.Errorf("bench: watch codec: cannot unmarshal into %T", v)
	}
	if len(data) == 1 {
		return m.parse(data[0].ReadOnlyData())
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	return m.parse(buf.ReadOnlyData())
}

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
	conn    *grpc.ClientConn
	stream  grpc.ClientStream
	mine    []int         // the round's watcher numbers on this stream, in the order created
	created chan error    // the receiver's answer to each create
	ids     map[int64]int // watch ID -> watcher number; the receiver's own
}

var watchStreamDesc = grpc.StreamDesc{StreamName: "Watch", ServerStreams: true, ClientStreams: true}

// dialWatchStream opens a watch stream to endpoint for the watchers mine.
func dialWatchStream(ctx context.Context, w *proxyWatchRound, endpoint string, mine []int) (*rawWatchStream, error) {
	host := strings.TrimPrefix(strings.TrimPrefix(endpoint, "http://"), "https://")
	conn, err := grpc.NewClient(host, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("bench: dial %s: %w", host, err)
	}
	stream, err := conn.NewStream(ctx, &watchStreamDesc, "/etcdserverpb.Watch/Watch", grpc.ForceCodecV2(watchCodec{}))
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("bench: watch stream to %s: %w", host, err)
	}
	return &rawWatchStream{w: w, conn: conn, stream: stream, mine: mine, created: make(chan error, 1), ids: make(map[int64]int, len(mine))}, nil
}

// open creates the stream's watches of key, one at a time.
func (s *rawWatchStream) open(ctx context.Context, key string) error {
	req := &pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: &pb.WatchCreateRequest{Key: []byte(key)}}}
	timer := time.NewTimer(watchCreateTimeout)
	defer timer.Stop()
	for _, i := range s.mine {
		if err := s.stream.SendMsg(req); err != nil {
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
	for {
		if err := s.stream.RecvMsg(&m); err != nil {
			select { // an opener still waiting
			case s.created <- fmt.Errorf("watch stream ended: %w", err):
			default:
			}
			return
		}
		switch {
		case m.created && len(s.ids) < len(s.mine):
			if m.canceled {
				s.created <- fmt.Errorf("refused: %s", m.reason)
				s.ids[m.id] = -1
				continue
			}
			s.ids[m.id] = s.mine[len(s.ids)]
			live++
			s.created <- nil
		case m.canceled:
			if i, ok := s.ids[m.id]; ok && i >= 0 {
				s.ids[m.id] = -1
				live--
				w.ended.Add(1)
			}
		default:
			s.record(&m)
		}
	}
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
	if i, ok := s.ids[m.id]; ok && i >= 0 {
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
			_ = s.conn.Close()
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
