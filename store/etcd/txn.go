package etcd

import (
	"context"
	"fmt"

	"github.com/beaconplane/beacon/store"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// directKV sends transactions as protobuf requests built in one go, for a
// client Open made. clientv3's builder (Compare, OpPut, Txn.If/Then) costs
// about ten allocations per operation: it copies each value twice (to a
// string and back), each key twice, and wraps every op and compare on its
// own; that was a sixth of the CPU a batched registration costs the
// client. Clients given to NewFromClient keep going through their KV,
// which may add a namespace or other behaviour of the caller's.
type directKV struct {
	kv       pb.KVClient // clientv3.RetryKVClient: the client's connection and interceptors
	callOpts []grpc.CallOption
}

// newDirectKV returns the direct path for cli, made from ccfg. The call
// options are the ones clientv3's own KV uses (clientv3.Client sets them
// from the same Config fields).
func newDirectKV(cli *clientv3.Client, ccfg clientv3.Config) *directKV {
	send, recv := 2<<20, int(^uint32(0)>>1) // clientv3's defaults
	if ccfg.MaxCallSendMsgSize > 0 {
		send = ccfg.MaxCallSendMsgSize
	}
	if ccfg.MaxCallRecvMsgSize > 0 {
		recv = ccfg.MaxCallRecvMsgSize
	}
	return &directKV{
		kv: clientv3.RetryKVClient(cli),
		callOpts: []grpc.CallOption{grpc.WaitForReady(true), grpc.MaxCallSendMsgSize(send), grpc.MaxCallRecvMsgSize(recv),
			grpc.ForceCodecV2(txnCodec{encoding.GetCodecV2("proto")})},
	}
}

func (d *directKV) txn(ctx context.Context, req *pb.TxnRequest) (*clientv3.TxnResponse, error) {
	resp, err := d.kv.Txn(ctx, req, d.callOpts...)
	if err != nil {
		return nil, clientv3.ContextError(ctx, err)
	}
	return (*clientv3.TxnResponse)(resp), nil
}

// txnRequest is ops as one etcd transaction without a failure branch: the
// preconditions are its compares (the same as the clientv3 path's), the
// ops its success branch. The messages of all ops share a few
// allocations; values are not copied (the request is only read).
func txnRequest(ops []store.Op) *pb.TxnRequest {
	n := len(ops)
	ncmp, keyBytes := 0, 0
	for _, op := range ops {
		keyBytes += len(op.Key)
		if op.IfAbsent {
			ncmp++
		}
		if op.IfModRevision != 0 {
			ncmp++
			if op.IfModRevision < 0 {
				ncmp++
			}
		}
	}
	var (
		keys    = make([]byte, 0, keyBytes)
		reqs    = make([]pb.RequestOp, n)
		then    = make([]*pb.RequestOp, n)
		cmps    = make([]pb.Compare, 0, ncmp)
		cmpPtrs = make([]*pb.Compare, 0, ncmp)
		puts    []pb.PutRequest
		putOps  []pb.RequestOp_RequestPut
		revs    = make([]pb.Compare_CreateRevision, 0, ncmp)
		mods    = make([]pb.Compare_ModRevision, 0, ncmp)
	)
	for _, op := range ops {
		if op.Kind == store.OpPut {
			puts = make([]pb.PutRequest, 0, n)
			putOps = make([]pb.RequestOp_RequestPut, 0, n)
			break
		}
	}
	for i, op := range ops {
		start := len(keys)
		keys = append(keys, op.Key...)
		key := keys[start:len(keys):len(keys)]
		if op.IfAbsent {
			revs = append(revs, pb.Compare_CreateRevision{CreateRevision: 0})
			cmps = append(cmps, pb.Compare{Result: pb.Compare_EQUAL, Target: pb.Compare_CREATE, Key: key, TargetUnion: &revs[len(revs)-1]})
		}
		if op.IfModRevision != 0 {
			// casCompares: the mod revision, and for rev <= 0 that the
			// key exists.
			mods = append(mods, pb.Compare_ModRevision{ModRevision: op.IfModRevision})
			cmps = append(cmps, pb.Compare{Result: pb.Compare_EQUAL, Target: pb.Compare_MOD, Key: key, TargetUnion: &mods[len(mods)-1]})
			if op.IfModRevision < 0 {
				revs = append(revs, pb.Compare_CreateRevision{CreateRevision: 0})
				cmps = append(cmps, pb.Compare{Result: pb.Compare_GREATER, Target: pb.Compare_CREATE, Key: key, TargetUnion: &revs[len(revs)-1]})
			}
		}
		switch op.Kind {
		case store.OpPut:
			puts = append(puts, pb.PutRequest{Key: key, Value: op.Value, Lease: int64(op.Lease)})
			putOps = append(putOps, pb.RequestOp_RequestPut{RequestPut: &puts[len(puts)-1]})
			reqs[i].Request = &putOps[len(putOps)-1]
		case store.OpDelete:
			reqs[i].Request = &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{Key: key}}
		}
		then[i] = &reqs[i]
	}
	for i := range cmps {
		cmpPtrs = append(cmpPtrs, &cmps[i])
	}
	return &pb.TxnRequest{Compare: cmpPtrs, Success: then}
}

// txnCodec is gRPC's proto codec, except that it decodes a TxnResponse
// without its per-operation responses: Txn reads only whether the
// transaction succeeded and at which revision (a failed precondition is
// looked into with a read of its own). etcd answers a batch of N puts
// with N responses, each with a header of its own, which cost the client
// 3N+1 allocations to decode and the garbage collector to free — about a
// tenth of a batched registration's client CPU. It goes on the wire as
// "proto", like the codec it wraps.
type txnCodec struct{ proto encoding.CodecV2 }

func (c txnCodec) Name() string { return c.proto.Name() }

func (c txnCodec) Marshal(v any) (mem.BufferSlice, error) { return c.proto.Marshal(v) }

func (c txnCodec) Unmarshal(data mem.BufferSlice, v any) error {
	resp, ok := v.(*pb.TxnResponse)
	if !ok {
		return c.proto.Unmarshal(data, v)
	}
	var b []byte
	if len(data) == 1 {
		b = data[0].ReadOnlyData()
	} else {
		buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
		defer buf.Free()
		b = buf.ReadOnlyData()
	}
	return decodeTxnSummary(b, resp)
}

// decodeTxnSummary decodes the header and the succeeded flag of a
// TxnResponse in its wire form, skipping its responses (field 3) and any
// field it does not know.
func decodeTxnSummary(b []byte, resp *pb.TxnResponse) error {
	const (
		fieldHeader    = 1
		fieldSucceeded = 2
	)
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("etcd: transaction response: %w", protowire.ParseError(n))
		}
		b = b[n:]
		switch {
		case num == fieldHeader && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return fmt.Errorf("etcd: transaction response header: %w", protowire.ParseError(n))
			}
			if resp.Header == nil {
				resp.Header = new(pb.ResponseHeader)
			}
			if err := (proto.UnmarshalOptions{Merge: true}).Unmarshal(v, resp.Header); err != nil { // repeated: merged, as proto does
				return fmt.Errorf("etcd: transaction response header: %w", err)
			}
			b = b[n:]
		case num == fieldSucceeded && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return fmt.Errorf("etcd: transaction response: %w", protowire.ParseError(n))
			}
			resp.Succeeded = v != 0
			b = b[n:]
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return fmt.Errorf("etcd: transaction response: %w", protowire.ParseError(n))
			}
			b = b[n:]
		}
	}
	return nil
}
