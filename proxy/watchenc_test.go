package proxy

import (
	"fmt"
	"math/rand/v2"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// The wire encoding on its own: a spliced response must decode, with
// protobuf's own decoder, to the WatchResponse etcd would send — built
// here field by field from the events, not by the encoder.

// randomBatch is n events from revision rev on, puts and deletes.
func randomBatch(rnd *rand.Rand, rev int64, n int) []*mvccpb.Event {
	var evs []*mvccpb.Event
	for i := range n {
		r := rev + int64(i)
		ev := &mvccpb.Event{Type: mvccpb.PUT, Kv: &mvccpb.KeyValue{Key: fmt.Appendf(nil, "k%d", rnd.IntN(5)), Value: make([]byte, rnd.IntN(300)),
			CreateRevision: 1, ModRevision: r, Version: r}}
		if rnd.IntN(3) == 0 {
			ev.Type = mvccpb.DELETE
			ev.Kv.Value = nil
		}
		if rnd.IntN(2) == 0 {
			ev.PrevKv = &mvccpb.KeyValue{Key: ev.Kv.Key, Value: []byte("prev"), ModRevision: r - 1}
		}
		evs = append(evs, ev)
	}
	return evs
}

// TestSpliceDecodesToEtcdsResponse: for random batches, filters, watch
// IDs and start revisions within the segments, the spliced response is
// the newest batch's header, the watch ID and every event the watcher
// needs, in order, also in a buffer an earlier response used.
func TestSpliceDecodesToEtcdsResponse(t *testing.T) {
	rnd := rand.New(rand.NewPCG(23, 4))
	for i := range 2000 {
		rev := int64(1)
		var segs []seg
		var want pb.WatchResponse
		for range 1 + rnd.IntN(4) {
			evs := randomBatch(rnd, rev, 1+rnd.IntN(5))
			hdr := &pb.ResponseHeader{ClusterId: rnd.Uint64(), MemberId: 7, Revision: rev + int64(len(evs)) + rnd.Int64N(3), RaftTerm: 2}
			b := newBatch(hdr, evs)
			from := rev + rnd.Int64N(int64(len(evs))+1)
			segs = append(segs, seg{b: b, from: from})
			want.Header = hdr
			rev += int64(len(evs))
		}
		noPut, noDel := rnd.IntN(4) == 0, rnd.IntN(4) == 0
		id := int64(rnd.IntN(3)) * int64(rnd.Uint32())
		for _, s := range segs {
			for _, ev := range s.b.events {
				if ev.Kv.ModRevision < s.from || (ev.Type == mvccpb.PUT && noPut) || (ev.Type == mvccpb.DELETE && noDel) {
					continue
				}
				want.Events = append(want.Events, ev)
			}
		}
		want.WatchId = id
		var sp spliced
		n := splice(&sp, id, filterVariant(noPut, noDel), segs)
		if len(want.Events) == 0 {
			if sp.data != nil || n != 0 {
				t.Fatalf("case %d: a response of %d events where the filters leave none", i, n)
			}
			continue
		}
		if n != len(want.Events) {
			t.Fatalf("case %d: splice counts %d events, want %d", i, n, len(want.Events))
		}
		data, err := newCodec().Marshal(&sp)
		if err != nil {
			t.Fatal(err)
		}
		var got pb.WatchResponse
		if err := proto.Unmarshal(data.Materialize(), &got); err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		if !proto.Equal(&got, &want) {
			t.Fatalf("case %d: spliced\n%v\nwant\n%v", i, &got, &want)
		}
		data.Free() // as gRPC does once written: the next cases splice into reused, uncleared buffers
	}
}

// TestBatchSizeCoversItsEncoding: the size a batch counts against the
// stream bounds is at least what its events take on the wire.
func TestBatchSizeCoversItsEncoding(t *testing.T) {
	rnd := rand.New(rand.NewPCG(5, 6))
	for range 200 {
		evs := randomBatch(rnd, 1, 1+rnd.IntN(20))
		b := newBatch(&pb.ResponseHeader{}, evs)
		if enc := len(b.encoded(0).buf); b.size < enc {
			t.Fatalf("batch size %d below its encoding %d", b.size, enc)
		}
		if b.last != evs[len(evs)-1].Kv.ModRevision {
			t.Fatalf("batch last %d, want %d", b.last, evs[len(evs)-1].Kv.ModRevision)
		}
	}
}

// TestResponseBufsAreReturnedToTheirPool: a spliced response's buffer has
// the length asked for and a capacity gRPC pools (above mem's threshold),
// so that gRPC's Free gives it back rather than dropping it; the small
// ones all have one capacity, the pool's.
func TestResponseBufsAreReturnedToTheirPool(t *testing.T) {
	for _, n := range []int{0, 1, 300, 1024, smallResponseBuf, smallResponseBuf + 1, 5000, 40000} {
		p := spliceBufs.Get(n)
		if len(*p) != n || cap(*p) < n {
			t.Fatalf("Get(%d): len %d cap %d", n, len(*p), cap(*p))
		}
		if n <= smallResponseBuf && cap(*p) != smallResponseBuf {
			t.Fatalf("Get(%d): cap %d, want the small buffers' %d", n, cap(*p), smallResponseBuf)
		}
		if mem.IsBelowBufferPoolingThreshold(cap(*p)) {
			t.Fatalf("Get(%d): cap %d is below gRPC's pooling threshold: Free would drop the buffer", n, cap(*p))
		}
		b := mem.NewBuffer(p, spliceBufs)
		if _, ok := b.(mem.SliceBuffer); ok {
			t.Fatalf("Get(%d): gRPC does not pool the buffer", n)
		}
		b.Free()
	}
}
