package etcd

import (
	"context"
	"testing"

	"github.com/beaconplane/beacon/store"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
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

// TestTxnRequestMatchesClientv3: the request the direct path builds is
// the one clientv3's builder makes for the same ops (NewFromClient's
// path), compares and all.
func TestTxnRequestMatchesClientv3(t *testing.T) {
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
	} {
		t.Run(name, func(t *testing.T) {
			capture := &capturingKV{}
			if _, err := txnThroughKV(context.Background(), clientv3.NewKVFromKVClient(capture, nil), ops); err != nil {
				t.Fatal(err)
			}
			if got := txnRequest(ops); !proto.Equal(got, capture.got) {
				t.Errorf("direct request\n%v\nclientv3's\n%v", got, capture.got)
			}
		})
	}
}
