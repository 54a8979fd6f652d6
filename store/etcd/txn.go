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

// directKV sends transactions encoded straight from the store's ops, for
// a client Open made. clientv3's builder (Compare, OpPut, Txn.If/Then)
// costs about ten allocations per operation: it copies each value twice
// (to a string and back), each key twice, and wraps every op and compare
// on its own; that was a sixth of the CPU a batched registration costs the
// client. Building the protobuf messages in one go and having protobuf
// marshal them still cost a tenth (sizing and walking the messages by
// reflection); the ops are now written to the wire by txnWire. Clients
// given to NewFromClient keep going through their KV, which may add a
// namespace or other behaviour of the caller's.
type directKV struct {
	conn     *grpc.ClientConn // the client's connection, with its interceptors (retries, credentials)
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
		conn: cli.ActiveConnection(),
		callOpts: []grpc.CallOption{grpc.WaitForReady(true), grpc.MaxCallSendMsgSize(send), grpc.MaxCallRecvMsgSize(recv),
			grpc.ForceCodecV2(txnCodec{encoding.GetCodecV2("proto")})},
	}
}

// txnMethod is etcd's KV.Txn, as pb.KVClient calls it.
const txnMethod = "/etcdserverpb.KV/Txn"

func (d *directKV) txn(ctx context.Context, ops []store.Op) (*clientv3.TxnResponse, error) {
	resp := new(pb.TxnResponse)
	if err := d.conn.Invoke(ctx, txnMethod, txnWire(ops), resp, d.callOpts...); err != nil {
		return nil, clientv3.ContextError(ctx, err)
	}
	return (*clientv3.TxnResponse)(resp), nil
}

// txnWire is ops as one etcd transaction (a TxnRequest) without a failure
// branch: the preconditions are its compares (the same as the clientv3
// path's), the ops its success branch. txnCodec writes it in protobuf's
// wire form, byte for byte what proto.Marshal makes of the same request
// (TestTxnWireIsProtobufs).
type txnWire []store.Op

// Field numbers of the messages txnWire writes (etcd's rpc.proto).
const (
	fieldTxnCompare   = 1 // TxnRequest.compare
	fieldTxnSuccess   = 2 // TxnRequest.success
	fieldOpPut        = 2 // RequestOp.request_put
	fieldOpDelete     = 3 // RequestOp.request_delete_range
	fieldKey          = 1 // PutRequest.key, DeleteRangeRequest.key
	fieldPutValue     = 2
	fieldPutLease     = 3
	fieldCmpResult    = 1
	fieldCmpTarget    = 2
	fieldCmpKey       = 3
	fieldCmpCreateRev = 5 // the target_union oneof: written even when zero
	fieldCmpModRev    = 6
	cmpEqual          = int64(pb.Compare_EQUAL) // zero: not written
	cmpGreater        = int64(pb.Compare_GREATER)
	cmpTargetCreate   = int64(pb.Compare_CREATE)
	cmpTargetMod      = int64(pb.Compare_MOD)
)

// compare is one of a transaction's preconditions.
type compare struct {
	result, target int64
	unionField     protowire.Number // the target_union field: create or mod revision
	union          int64
}

// compares returns op's preconditions (casCompares' rules): that the key
// does not exist; that its mod revision is IfModRevision, and for a
// revision <= 0 that it exists. They go to appendTo and size alike.
func compares(op store.Op, buf *[3]compare) []compare {
	cs := buf[:0]
	if op.IfAbsent {
		cs = append(cs, compare{cmpEqual, cmpTargetCreate, fieldCmpCreateRev, 0})
	}
	if op.IfModRevision != 0 {
		cs = append(cs, compare{cmpEqual, cmpTargetMod, fieldCmpModRev, op.IfModRevision})
		if op.IfModRevision < 0 {
			cs = append(cs, compare{cmpGreater, cmpTargetCreate, fieldCmpCreateRev, 0})
		}
	}
	return cs
}

// appendTo appends the request to b; size says how long it is.
func (t txnWire) appendTo(b []byte) []byte {
	var buf [3]compare
	for _, op := range t {
		for _, c := range compares(op, &buf) {
			b = appendCompare(b, op.Key, c)
		}
	}
	for _, op := range t {
		field, inner := requestSize(op)
		b = protowire.AppendTag(b, fieldTxnSuccess, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(protowire.SizeTag(field)+protowire.SizeBytes(inner)))
		b = protowire.AppendTag(b, field, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(inner))
		b = appendBytesField(b, fieldKey, op.Key)
		if op.Kind == store.OpPut {
			b = appendBytesField(b, fieldPutValue, op.Value)
			b = appendVarintField(b, fieldPutLease, int64(op.Lease))
		}
	}
	return b
}

// size is the length of the request appendTo writes.
func (t txnWire) size() int {
	var buf [3]compare
	n := 0
	for _, op := range t {
		for _, c := range compares(op, &buf) {
			n += protowire.SizeTag(fieldTxnCompare) + protowire.SizeBytes(compareBodySize(op.Key, c))
		}
		field, inner := requestSize(op)
		n += protowire.SizeTag(fieldTxnSuccess) + protowire.SizeBytes(protowire.SizeTag(field)+protowire.SizeBytes(inner))
	}
	return n
}

// requestSize is the RequestOp field of op (a put or a delete) and the
// length of its message.
func requestSize(op store.Op) (field protowire.Number, size int) {
	size = bytesFieldSize(fieldKey, op.Key)
	if op.Kind != store.OpPut {
		return fieldOpDelete, size
	}
	return fieldOpPut, size + bytesFieldSize(fieldPutValue, op.Value) + varintFieldSize(fieldPutLease, int64(op.Lease))
}

// appendCompare appends one TxnRequest.compare: result and target (each
// left out when zero, as proto3 does), the key, and the target_union
// field, which a oneof writes even when zero.
func appendCompare(b []byte, key string, c compare) []byte {
	b = protowire.AppendTag(b, fieldTxnCompare, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(compareBodySize(key, c)))
	b = appendVarintField(b, fieldCmpResult, c.result)
	b = appendVarintField(b, fieldCmpTarget, c.target)
	b = appendBytesField(b, fieldCmpKey, key)
	b = protowire.AppendTag(b, c.unionField, protowire.VarintType)
	return protowire.AppendVarint(b, uint64(c.union))
}

func compareBodySize(key string, c compare) int {
	return varintFieldSize(fieldCmpResult, c.result) + varintFieldSize(fieldCmpTarget, c.target) + bytesFieldSize(fieldCmpKey, key) +
		protowire.SizeTag(c.unionField) + protowire.SizeVarint(uint64(c.union))
}

// appendBytesField appends a bytes field, left out when empty (proto3).
func appendBytesField[T string | []byte](b []byte, num protowire.Number, v T) []byte {
	if len(v) == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(len(v)))
	return append(b, v...)
}

func bytesFieldSize[T string | []byte](num protowire.Number, v T) int {
	if len(v) == 0 {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeBytes(len(v))
}

// appendVarintField appends an int64 or enum field, left out when zero.
func appendVarintField(b []byte, num protowire.Number, v int64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, uint64(v))
}

func varintFieldSize(num protowire.Number, v int64) int {
	if v == 0 {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeVarint(uint64(v))
}

// txnCodec is gRPC's proto codec, except that it writes a txnWire, and
// decodes a TxnResponse
// without its per-operation responses: Txn reads only whether the
// transaction succeeded and at which revision (a failed precondition is
// looked into with a read of its own). etcd answers a batch of N puts
// with N responses, each with a header of its own, which cost the client
// 3N+1 allocations to decode and the garbage collector to free — about a
// tenth of a batched registration's client CPU. It goes on the wire as
// "proto", like the codec it wraps.
type txnCodec struct{ proto encoding.CodecV2 }

func (c txnCodec) Name() string { return c.proto.Name() }

func (c txnCodec) Marshal(v any) (mem.BufferSlice, error) {
	t, ok := v.(txnWire)
	if !ok {
		return c.proto.Marshal(v)
	}
	size := t.size()
	pool := mem.DefaultBufferPool()
	buf := pool.Get(size)
	*buf = t.appendTo((*buf)[:0])
	return mem.BufferSlice{mem.NewBuffer(buf, pool)}, nil
}

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
