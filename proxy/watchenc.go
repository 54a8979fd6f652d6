package proxy

import (
	"sort"
	"sync"

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
// watcher needs. gRPC writes the parts without copying them into one
// message first. Responses that wait for a slow client stream are merged
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

	hdrOnce sync.Once
	hdrPart mem.Buffer

	encs [4]struct {
		once sync.Once
		e    *encodedEvents
	}
}

// encodedEvents is a batch's events that pass one filter variant,
// encoded as repeated field 11 of a WatchResponse.
type encodedEvents struct {
	buf  []byte
	off  []int   // where each event starts in buf
	rev  []int64 // each event's mod revision (ascending)
	full mem.Buffer
}

func newBatch(hdr *pb.ResponseHeader, evs []*mvccpb.Event) *evBatch {
	b := &evBatch{hdr: hdr, events: evs, last: evs[len(evs)-1].Kv.ModRevision}
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
		e.full = mem.SliceBuffer(e.buf)
		slot.e = e
	})
	return slot.e
}

// from returns the encoded events at or above revision rev and how many
// there are.
func (e *encodedEvents) from(rev int64) (mem.Buffer, int) {
	k := 0
	if len(e.rev) > 0 && e.rev[0] < rev {
		k = sort.Search(len(e.rev), func(i int) bool { return e.rev[i] >= rev })
	}
	n := len(e.rev) - k
	switch {
	case n == 0:
		return nil, 0
	case k == 0:
		return e.full, n
	}
	return mem.SliceBuffer(e.buf[e.off[k]:]), n
}

// header returns the batch's header, encoded as field 1.
func (b *evBatch) header() mem.Buffer {
	b.hdrOnce.Do(func() {
		h := b.hdr
		if h == nil {
			h = &pb.ResponseHeader{}
		}
		buf := protowire.AppendTag(nil, fieldWatchHeader, protowire.BytesType)
		buf = protowire.AppendVarint(buf, uint64(proto.Size(h)))
		buf, _ = proto.MarshalOptions{UseCachedSize: true}.MarshalAppend(buf, h)
		b.hdrPart = mem.SliceBuffer(buf)
	})
	return b.hdrPart
}

// watchIDPart encodes a watch ID as field 2 (nil for 0, proto3's default).
func watchIDPart(id int64) mem.Buffer {
	if id == 0 {
		return nil
	}
	buf := protowire.AppendTag(nil, fieldWatchID, protowire.VarintType)
	return mem.SliceBuffer(protowire.AppendVarint(buf, uint64(id)))
}

// spliced is a WatchResponse assembled from encoded parts; the codec
// hands the parts to gRPC as they are. Most have few parts: they live in
// the same allocation.
type spliced struct {
	parts  mem.BufferSlice
	inline [4]mem.Buffer
}

// seg is one upstream response's events for a watcher, from revision from.
type seg struct {
	b    *evBatch
	from int64
}

// splice assembles a watcher's response from its queued segments: the
// newest segment's header, the watch ID, the events of every segment. It
// returns nil when the filters left no event.
func splice(w *cwatcher, segs []seg) (*spliced, int) {
	nsegs := len(segs)
	sp := &spliced{}
	sp.parts = sp.inline[:0]
	if nsegs+2 > len(sp.inline) {
		sp.parts = make(mem.BufferSlice, 0, nsegs+2)
	}
	sp.parts = append(sp.parts, nil) // the header, once the last segment is known
	if w.idPart != nil {
		sp.parts = append(sp.parts, w.idPart)
	}
	n := 0
	var last *evBatch
	for _, s := range segs {
		last = s.b
		if p, k := s.b.encoded(w.variant).from(s.from); k > 0 {
			sp.parts = append(sp.parts, p)
			n += k
		}
	}
	if n == 0 {
		return nil, 0
	}
	sp.parts[0] = last.header()
	return sp, n
}
