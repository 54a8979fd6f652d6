package etcd

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/beaconplane/beacon/store"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// capturingKV is a pb.KVClient that keeps the transaction it is sent.
type capturingKV struct {
	pb.KVClient
	got *pb.TxnRequest
}

func (c *capturingKV) Txn(_ context.Context, in *pb.TxnRequest, _ ...grpc.CallOption) (*pb.TxnResponse, error) {
	c.got = in
	return &pb.TxnResponse{Header: &pb.ResponseHeader{}, Succeeded: true}, nil
}

// clientv3Request is the request clientv3's builder makes for ops
// (NewFromClient's path).
func clientv3Request(t testing.TB, ops []store.Op) *pb.TxnRequest {
	capture := &capturingKV{}
	if _, err := txnThroughKV(context.Background(), clientv3.NewKVFromKVClient(capture, nil), ops); err != nil {
		t.Fatal(err)
	}
	return capture.got
}

// wireOf is what the direct path sends for ops: txnCodec's bytes.
func wireOf(t testing.TB, ops []store.Op) []byte {
	data, err := (txnCodec{encoding.GetCodecV2("proto")}).Marshal(txnWire(ops))
	if err != nil {
		t.Fatal(err)
	}
	defer data.Free()
	return data.Materialize()
}

// TestTxnWireIsProtobufs: the request the direct path writes is, byte for
// byte, protobuf's encoding of the request clientv3's builder makes for
// the same ops (NewFromClient's path), compares and all.
func TestTxnWireIsProtobufs(t *testing.T) {
	for name, ops := range map[string][]store.Op{
		"creates": {
			{Kind: store.OpPut, Key: "/a", Value: []byte(`{"x":1}`), Lease: 7, IfAbsent: true},
			{Kind: store.OpPut, Key: "/bb", Value: []byte("v"), Lease: 7, IfAbsent: true},
		},
		"mixed": {
			{Kind: store.OpPut, Key: "/a", Value: []byte("1"), IfModRevision: 12},
			{Kind: store.OpDelete, Key: "/b", IfModRevision: -1},
			{Kind: store.OpPut, Key: "/c", Value: []byte{}, Lease: 3},
			{Kind: store.OpDelete, Key: "/d", IfAbsent: true},
			{Kind: store.OpPut, Key: "/e", Value: []byte("e"), IfAbsent: true, IfModRevision: 5},
		},
		"large": {
			{Kind: store.OpPut, Key: strings.Repeat("k", 300), Value: make([]byte, 70_000), Lease: 1 << 62, IfAbsent: true},
			{Kind: store.OpPut, Key: "/f", Value: []byte("f"), IfModRevision: 1 << 40},
		},
	} {
		t.Run(name, func(t *testing.T) {
			checkWire(t, ops)
		})
	}
}

func checkWire(t testing.TB, ops []store.Op) {
	want, err := proto.Marshal(clientv3Request(t, ops))
	if err != nil {
		t.Fatal(err)
	}
	if got := wireOf(t, ops); !bytes.Equal(got, want) {
		var dec pb.TxnRequest
		derr := proto.Unmarshal(got, &dec)
		t.Fatalf("ops %v: direct request\n%x (%v, %v)\nprotobuf's of clientv3's\n%x", ops, got, &dec, derr, want)
	}
}

// FuzzTxnWire: any ops, written as protobuf would write clientv3's
// request for them.
func FuzzTxnWire(f *testing.F) {
	f.Add("/a", []byte("v"), int64(7), true, int64(0), false, "/b", int64(-1))
	f.Add("k", []byte{}, int64(0), false, int64(1<<40), true, "", int64(3))
	f.Fuzz(func(t *testing.T, key string, val []byte, lease int64, absent bool, mod int64, del bool, key2 string, mod2 int64) {
		op := store.Op{Kind: store.OpPut, Key: key, Value: val, Lease: store.LeaseID(lease), IfAbsent: absent, IfModRevision: mod}
		if del {
			op = store.Op{Kind: store.OpDelete, Key: key, IfAbsent: absent, IfModRevision: mod}
		}
		checkWire(t, []store.Op{op, {Kind: store.OpDelete, Key: key2, IfModRevision: mod2}})
	})
}

// TestTxnSummaryMatchesProto: the transaction codec decodes the header
// and the outcome exactly as the full protobuf decoding does, whatever
// the responses, and hands other messages to the proto codec.
func TestTxnSummaryMatchesProto(t *testing.T) {
	hdr := &pb.ResponseHeader{ClusterId: 1 << 60, MemberId: 7, Revision: 1<<40 + 3, RaftTerm: 9}
	for name, resp := range map[string]*pb.TxnResponse{
		"empty":     {},
		"succeeded": {Header: hdr, Succeeded: true},
		"with puts": {Header: hdr, Succeeded: true, Responses: []*pb.ResponseOp{
			{Response: &pb.ResponseOp_ResponsePut{ResponsePut: &pb.PutResponse{Header: hdr}}},
			{Response: &pb.ResponseOp_ResponsePut{ResponsePut: &pb.PutResponse{Header: hdr}}},
		}},
		"failed with ranges": {Header: hdr, Responses: []*pb.ResponseOp{
			{Response: &pb.ResponseOp_ResponseRange{ResponseRange: &pb.RangeResponse{Header: hdr, Count: 3}}},
		}},
	} {
		b, err := proto.Marshal(resp)
		if err != nil {
			t.Fatal(err)
		}
		var got pb.TxnResponse
		codec := txnCodec{encoding.GetCodecV2("proto")}
		// In one buffer and split in two, as gRPC may hand it over.
		for _, data := range []mem.BufferSlice{{mem.SliceBuffer(b)}, split(b)} {
			got = pb.TxnResponse{}
			if err := codec.Unmarshal(data, &got); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if got.Succeeded != resp.Succeeded || !proto.Equal(got.Header, resp.Header) || got.Responses != nil {
				t.Errorf("%s: got %v, want the header and outcome of %v", name, &got, resp)
			}
		}
	}
	// Anything else goes through the proto codec.
	rr := &pb.RangeResponse{Header: hdr, Count: 2}
	b, _ := proto.Marshal(rr)
	var got pb.RangeResponse
	if err := (txnCodec{encoding.GetCodecV2("proto")}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, &got); err != nil || !proto.Equal(&got, rr) {
		t.Errorf("range response through the codec: %v %v", &got, err)
	}
}

func split(b []byte) mem.BufferSlice {
	h := len(b) / 2
	return mem.BufferSlice{mem.SliceBuffer(b[:h]), mem.SliceBuffer(b[h:])}
}

// FuzzTxnSummary: on any input the summary decoder never panics, and
// where the full protobuf decoding accepts it, agrees with it.
func FuzzTxnSummary(f *testing.F) {
	hdr := &pb.ResponseHeader{Revision: 42}
	for _, r := range []*pb.TxnResponse{{}, {Header: hdr, Succeeded: true}, {Header: hdr, Responses: []*pb.ResponseOp{{Response: &pb.ResponseOp_ResponsePut{ResponsePut: &pb.PutResponse{Header: hdr}}}}}} {
		b, _ := proto.Marshal(r)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var got pb.TxnResponse
		err := decodeTxnSummary(b, &got)
		var full pb.TxnResponse
		if proto.Unmarshal(b, &full) != nil {
			return
		}
		if err != nil {
			t.Fatalf("summary refused what proto accepts: %v", err)
		}
		if got.Succeeded != full.Succeeded || !proto.Equal(got.Header, full.Header) {
			t.Fatalf("summary %v, proto %v", &got, &full)
		}
	})
}
