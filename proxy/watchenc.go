package proxy

import (
	"sort"
	"sync"
	"sync/atomic"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// Shared encoding of watch events.
//
// Every watcher of an upstream watch receives the same events (less those
// below its start revision or removed by its filters), so the proxy
// encodes an upstream response's events once per filter variant, and each
// client response is spliced from encoded parts: the shared header, the
// watcher's own watch ID, and the shared events from the first one the
// watcher needs, copied into one buffer that gRPC writes as it is.
// Responses that wait for a slow client stream are merged
// per watcher (several upstream responses in one client response, as
// etcd's own watch server does), so a stream that lags gets fewer, larger
// messages instead of falling further behind.

// WatchResponse field numbers (etcd api/etcdserverpb/rpc.proto).
const (
	fieldWatchHeader = 1
	fieldWatchID     = 2
	fieldWatchEvents = 11
)

// evBatch is the events of one upstream response, shared by its
// receivers.
type evBatch struct {
	hdr    *pb.ResponseHeader
	events []*mvccpb.Event
	last   int64 // mod revision of the last event
	size   int   // encoded size of all events, for the queue bounds

	seq     uint64       // its place among all batches, in the order they were made (watchwait.go)
	holders atomic.Int32 // client streams holding it (watchwait.go)

	hdrOnce sync.Once
	hdrPart []byte

	encs [4]struct {
		once sync.Once
		e    *encodedEvents
	}
}

// encodedEvents is a batch's events that pass one filter variant,
// encoded as repeated field 11 of a WatchResponse.
type encodedEvents struct {
	buf []byte
	off []int   // where each event starts in buf
	rev []int64 // each event's mod revision (ascending)
}

func newBatch(hdr *pb.ResponseHeader, evs []*mvccpb.Event) *evBatch {
	b := &evBatch{hdr: hdr, events: evs, last: evs[len(evs)-1].Kv.ModRevision, seq: batchSeqs.Add(1)}
	for _, ev := range evs {
		b.size += proto.Size(ev) + 4
	}
	return b
}

// filterVariant numbers a watcher's filters: bit 0 drops puts, bit 1
// deletes.
func filterVariant(noPut, noDel bool) int {
	v := 0
	if noPut {
		v |= 1
	}
	if noDel {
		v |= 2
	}
	return v
}

// encoded returns the batch's events passing variant, encoded once.
func (b *evBatch) encoded(variant int) *encodedEvents {
	slot := &b.encs[variant]
	slot.once.Do(func() {
		e := &encodedEvents{buf: make([]byte, 0, b.size)}
		for _, ev := range b.events {
			if (ev.Type == mvccpb.PUT && variant&1 != 0) || (ev.Type == mvccpb.DELETE && variant&2 != 0) {
				continue
			}
			e.off = append(e.off, len(e.buf))
			e.rev = append(e.rev, ev.Kv.ModRevision)
			e.buf = protowire.AppendTag(e.buf, fieldWatchEvents, protowire.BytesType)
			e.buf = protowire.AppendVarint(e.buf, uint64(proto.Size(ev)))
			e.buf, _ = proto.MarshalOptions{UseCachedSize: true}.MarshalAppend(e.buf, ev)
		}
		slot.e = e
	})
	return slot.e
}

// from returns the encoded events at or above revision rev and how many
// there are.
func (e *encodedEvents) from(rev int64) ([]byte, int) {
	k := 0
	if len(e.rev) > 0 && e.rev[0] < rev {
		k = sort.Search(len(e.rev), func(i int) bool { return e.rev[i] >= rev })
	}
	n := len(e.rev) - k
	if n == 0 {
		return nil, 0
	}
	return e.buf[e.off[k]:], n
}

// header returns the batch's header, encoded as field 1.
func (b *evBatch) header() []byte {
	b.hdrOnce.Do(func() {
		h := b.hdr
		if h == nil {
			h = &pb.ResponseHeader{}
		}
		buf := protowire.AppendTag(nil, fieldWatchHeader, protowire.BytesType)
		buf = protowire.AppendVarint(buf, uint64(proto.Size(h)))
		b.hdrPart, _ = proto.MarshalOptions{UseCachedSize: true}.MarshalAppend(buf, h)
	})
	return b.hdrPart
}

// spliced is a WatchResponse assembled from encoded parts into one
// buffer, which the codec hands to gRPC as it is. A stream's sender keeps
// one and fills it for each response (gRPC marshals as it sends): only
// the buffer is new each time, from spliceBufs, and goes back there once
// gRPC has written it.
type spliced struct {
	data  mem.BufferSlice
	parts [][]byte // splice's scratch: each segment's encoded events
}

// spliceBufs holds the buffers of spliced responses; gRPC returns each
// once it has written it.
var spliceBufs mem.BufferPool = &responseBufs{}

// responseBufs pools the buffers of spliced responses. gRPC's own pools
// take no buffer of 1 KiB or less (mem's pooling threshold), so a small
// response, most of them (one event of a few hundred bytes), gets a
// buffer of smallResponseBuf bytes, just above it, from a pool of its
// own; a larger one comes from gRPC's default pool. The buffers are not
// cleared: splice writes every byte of a response before gRPC reads it.
// Small responses were a heap allocation each, and at 100,000 watchers
// the garbage collector's work on them about a third of the proxy's CPU
// per event (issue 26).
type responseBufs struct{ small sync.Pool }

// smallResponseBuf is the size of the small responses' buffers.
const smallResponseBuf = 1<<10 + 64

func (p *responseBufs) Get(n int) *[]byte {
	if n > smallResponseBuf {
		return mem.DefaultBufferPool().Get(n)
	}
	if b, ok := p.small.Get().(*[]byte); ok {
		*b = (*b)[:n]
		return b
	}
	b := make([]byte, n, smallResponseBuf)
	return &b
}

func (p *responseBufs) Put(b *[]byte) {
	if cap(*b) != smallResponseBuf {
		mem.DefaultBufferPool().Put(b)
		return
	}
	p.small.Put(b)
}

// seg is one upstream response's events for a watcher, from revision from.
type seg struct {
	b    *evBatch
	from int64
}

// splice assembles into sp the response of a watcher with watch ID id
// and filterVariant variant from its queued segments: the newest
// segment's header, the watch ID (left out when 0, proto3's default), the
// events of every segment. It returns how many events it holds: 0 when
// the filters left none (sp is then left as it was).
//
// One copy of the events into the response, against gRPC writing shared
// parts as they were (a part per segment, plus the watcher's own encoded
// ID): with 100,000 watchers every part a watcher owned was a cache miss
// as its stream's sender reached it, and every part a step in gRPC's
// writes (issue 26; docs/proxy.md has the measurements).
func splice(sp *spliced, id int64, variant int, segs []seg) int {
	size, n := 0, 0
	var last *evBatch
	sp.parts = sp.parts[:0]
	defer clear(sp.parts) // hold no batch past the response
	for _, s := range segs {
		last = s.b
		if p, k := s.b.encoded(variant).from(s.from); k > 0 {
			sp.parts = append(sp.parts, p)
			size += len(p)
			n += k
		}
	}
	if n == 0 {
		return 0
	}
	hdr := last.header()
	size += len(hdr)
	if id != 0 {
		size += protowire.SizeTag(fieldWatchID) + protowire.SizeVarint(uint64(id))
	}
	p := spliceBufs.Get(size)
	buf := (*p)[:0]
	buf = append(buf, hdr...)
	if id != 0 {
		buf = protowire.AppendTag(buf, fieldWatchID, protowire.VarintType)
		buf = protowire.AppendVarint(buf, uint64(id))
	}
	for _, p := range sp.parts {
		buf = append(buf, p...)
	}
	*p = buf
	sp.data = mem.BufferSlice{mem.NewBuffer(p, spliceBufs)}
	return n
}
