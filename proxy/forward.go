package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// frame is an encoded gRPC message the proxy forwards without decoding.
type frame struct{ data []byte }

// codec passes frames through as bytes and encodes everything else as
// protobuf, so one server can forward most methods verbatim and still
// decode the ones it handles itself (Watch, LeaseKeepAlive).
type codec struct{ proto encoding.CodecV2 }

func newCodec() codec { return codec{proto: encoding.GetCodecV2("proto")} }

func (c codec) Name() string { return "proto" }

func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	switch m := v.(type) {
	case *frame:
		return mem.BufferSlice{mem.SliceBuffer(m.data)}, nil
	case *spliced:
		return m.data, nil
	}
	return c.proto.Marshal(v)
}

func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	if f, ok := v.(*frame); ok {
		f.data = data.Materialize()
		return nil
	}
	return c.proto.Unmarshal(data, v)
}

// methodInfo classifies an RPC for forwarding and readonly mode.
type methodInfo struct {
	write  bool                  // refused in readonly mode
	isW    func(req []byte) bool // decides write from the request (Txn, Alarm)
	stream bool                  // server-streaming (one request, many responses)
	retry  bool                  // safe to retry on another endpoint
	name   string                // method name for metrics
}

const (
	kvSvc    = "/etcdserverpb.KV/"
	leaseSvc = "/etcdserverpb.Lease/"
	clusSvc  = "/etcdserverpb.Cluster/"
	mainSvc  = "/etcdserverpb.Maintenance/"
	authSvc  = "/etcdserverpb.Auth/"
	elecSvc  = "/v3electionpb.Election/"
	lockSvc  = "/v3lockpb.Lock/"

	watchMethod = "/etcdserverpb.Watch/Watch"
)

// methods lists every etcd v3 RPC. Reads are retried on another endpoint
// after a transport failure; writes are not (they may have been applied).
var methods = map[string]methodInfo{
	kvSvc + "Range":       {retry: true},
	kvSvc + "RangeStream": {stream: true},
	kvSvc + "Put":         {write: true},
	kvSvc + "DeleteRange": {write: true},
	kvSvc + "Txn":         {isW: txnWrites},
	kvSvc + "Compact":     {write: true},

	leaseSvc + "LeaseGrant":      {write: true},
	leaseSvc + "LeaseRevoke":     {write: true},
	leaseSvc + "LeaseTimeToLive": {retry: true},
	leaseSvc + "LeaseLeases":     {retry: true},

	clusSvc + "MemberAdd":     {write: true},
	clusSvc + "MemberRemove":  {write: true},
	clusSvc + "MemberUpdate":  {write: true},
	clusSvc + "MemberPromote": {write: true},
	clusSvc + "MemberList":    {retry: true},

	mainSvc + "Alarm":      {isW: alarmWrites},
	mainSvc + "Status":     {retry: true},
	mainSvc + "Defragment": {write: true},
	mainSvc + "Hash":       {retry: true},
	mainSvc + "HashKV":     {retry: true},
	mainSvc + "Snapshot":   {stream: true},
	mainSvc + "MoveLeader": {write: true},
	mainSvc + "Downgrade":  {write: true},

	authSvc + "AuthEnable":           {write: true},
	authSvc + "AuthDisable":          {write: true},
	authSvc + "AuthStatus":           {retry: true},
	authSvc + "Authenticate":         {},
	authSvc + "UserAdd":              {write: true},
	authSvc + "UserGet":              {retry: true},
	authSvc + "UserList":             {retry: true},
	authSvc + "UserDelete":           {write: true},
	authSvc + "UserChangePassword":   {write: true},
	authSvc + "UserGrantRole":        {write: true},
	authSvc + "UserRevokeRole":       {write: true},
	authSvc + "RoleAdd":              {write: true},
	authSvc + "RoleGet":              {retry: true},
	authSvc + "RoleList":             {retry: true},
	authSvc + "RoleDelete":           {write: true},
	authSvc + "RoleGrantPermission":  {write: true},
	authSvc + "RoleRevokePermission": {write: true},

	elecSvc + "Campaign": {write: true},
	elecSvc + "Proclaim": {write: true},
	elecSvc + "Leader":   {retry: true},
	elecSvc + "Observe":  {stream: true},
	elecSvc + "Resign":   {write: true},
	lockSvc + "Lock":     {write: true},
	lockSvc + "Unlock":   {write: true},
}

func init() {
	for name, m := range methods {
		m.name = name
		methods[name] = m
	}
}

// txnWrites reports whether an encoded TxnRequest contains a write in
// either branch (at any depth). Undecodable requests count as writes.
func txnWrites(b []byte) bool {
	var r pb.TxnRequest
	if err := proto.Unmarshal(b, &r); err != nil {
		return true
	}
	return txnHasWrite(&r)
}

func txnHasWrite(r *pb.TxnRequest) bool {
	for _, ops := range [][]*pb.RequestOp{r.Success, r.Failure} {
		for _, op := range ops {
			switch v := op.Request.(type) {
			case *pb.RequestOp_RequestRange:
			case *pb.RequestOp_RequestTxn:
				if v.RequestTxn == nil || txnHasWrite(v.RequestTxn) {
					return true
				}
			default:
				return true
			}
		}
	}
	return false
}

// alarmWrites: listing alarms (GET) is a read; activating or disarming one
// is a write.
func alarmWrites(b []byte) bool {
	var r pb.AlarmRequest
	if err := proto.Unmarshal(b, &r); err != nil {
		return true
	}
	return r.Action != pb.AlarmRequest_GET
}

// readonlyError is returned for a refused write.
func readonlyError(method string) error {
	return status.Errorf(codes.Unimplemented,
		"proxy: this proxy is readonly: %s is a write and is refused (send writes to a readwrite proxy or to the cluster)", method)
}

// forwardKeys are the client metadata keys etcd reads: the auth token
// (gRPC and gateway forms), require-leader and the client API version.
var forwardKeys = []string{rpctypes.TokenFieldNameGRPC, "authorization", rpctypes.MetadataRequireLeaderKey, rpctypes.MetadataClientAPIVersionKey}

// outgoing builds the metadata to send upstream: what etcd reads from the
// client's metadata (its auth token included, anonymousToken when it has
// none and the proxy would otherwise lend its identity), plus this proxy
// in the via list. It refuses requests that already passed through here.
func (p *Proxy) outgoing(ctx context.Context, method string) (context.Context, error) {
	via := metadata.ValueFromIncomingContext(ctx, viaKey)
	for _, v := range via {
		for _, id := range strings.Split(v, ",") {
			if strings.TrimSpace(id) == p.id {
				p.m.loops.Inc()
				return nil, status.Errorf(codes.FailedPrecondition,
					"%s: the request already passed through this proxy (%s); an endpoint leads back here", loopMessage, p.id)
			}
		}
	}
	if len(via) >= maxHops {
		return nil, status.Errorf(codes.FailedPrecondition, "%s: the request passed through %d proxies", loopMessage, len(via))
	}
	kv := make([]string, 0, 2*(len(via)+3))
	for _, k := range forwardKeys {
		for _, v := range metadata.ValueFromIncomingContext(ctx, k) {
			kv = append(kv, k, v)
		}
	}
	if p.lendsIdentity(ctx, method) { // anonymous.go
		kv = append(kv, rpctypes.TokenFieldNameGRPC, anonymousToken)
	}
	for _, v := range via {
		kv = append(kv, viaKey, v)
	}
	kv = append(kv, viaKey, p.id)
	// A fresh outgoing context (the incoming one carries none) with the
	// pairs appended lazily: cheaper than building a metadata map.
	return metadata.AppendToOutgoingContext(metadata.NewOutgoingContext(ctx, nil), kv...), nil
}

// isLoopError reports whether err is another hop refusing a looping
// request.
func isLoopError(err error) bool {
	s, ok := status.FromError(err)
	return ok && s.Code() == codes.FailedPrecondition && strings.HasPrefix(s.Message(), loopMessage)
}

// isTransportError reports whether err comes from reaching the endpoint
// rather than from etcd (whose messages start "etcdserver:").
func isTransportError(err error) bool {
	s, ok := status.FromError(err)
	if !ok || s.Code() != codes.Unavailable {
		return false
	}
	return !strings.HasPrefix(s.Message(), "etcdserver:")
}

// isEtcdRetryable reports etcd errors after which a read may be retried.
func isEtcdRetryable(err error) bool {
	s, ok := status.FromError(err)
	return ok && s.Code() == codes.Unavailable && strings.HasPrefix(s.Message(), "etcdserver:")
}

// isStoppedError reports etcd's "server stopped": the member is going down.
func isStoppedError(err error) bool {
	s, ok := status.FromError(err)
	return ok && s.Code() == codes.Unavailable && s.Message() == rpctypes.ErrorDesc(rpctypes.ErrGRPCStopped)
}

// noEndpointsError is what clients get when no member can be reached:
// none is usable, or none of those believed usable could be connected to
// (they are being checked).
func (p *Proxy) noEndpointsError(last error) error {
	known := p.dir.known()
	msg := fmt.Sprintf("%v: no etcd member reachable (%d known: %s)", ErrNoEndpoints, len(known), strings.Join(known, ", "))
	if p.dir.availableCount() > 0 {
		msg = fmt.Sprintf("proxy: no etcd member could be connected to (%d known: %s; checking them now)", len(known), strings.Join(known, ", "))
	}
	if last != nil {
		msg += "; last error: " + status.Convert(last).Message()
	}
	return status.Error(codes.Unavailable, msg)
}

// readyStream answers every stream with notReady until the proxy has
// found the cluster (unary calls check in unaryHandler).
func (p *Proxy) readyStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if err := p.notReady(); err != nil {
		p.refuseStream(ss, info, err)
		return err
	}
	return handler(srv, ss)
}

// refuseStream counts a stream refused with err before its handler ran,
// and lets it take its first message (takeFirst) so that the client sees
// err as the stream's status.
func (p *Proxy) refuseStream(ss grpc.ServerStream, info *grpc.StreamServerInfo, err error) {
	label := info.FullMethod
	if _, ok := methods[label]; !ok && label != "/etcdserverpb.Watch/Watch" && label != leaseSvc+"LeaseKeepAlive" {
		label = "unknown"
	}
	p.m.request(label, err)
	if info.IsClientStream {
		takeFirst(ss)
	}
}

// firstMessageWait bounds how long a refused stream waits for its first
// message.
const firstMessageWait = time.Second

// takeFirst waits (boundedly) for the first message of a stream that is
// about to be refused: a client that sends its request right after opening
// the stream (every etcd client, and the JSON gateway, which logs an error
// of its own when its send finds the stream already ended) then gets the
// refusal as the stream's status. The receiving goroutine ends with the
// stream.
func takeFirst(ss grpc.ServerStream) {
	got := make(chan struct{})
	go func() {
		_ = ss.RecvMsg(new(frame))
		close(got)
	}()
	t := time.NewTimer(firstMessageWait)
	defer t.Stop()
	select {
	case <-got:
	case <-t.C:
	case <-ss.Context().Done():
	}
}

// handleUnknown forwards every RPC the proxy does not implement itself.
func (p *Proxy) handleUnknown(_ any, ss grpc.ServerStream) error {
	method, _ := grpc.MethodFromServerStream(ss)
	info, known := methods[method]
	label := info.name
	if !known {
		label = "unknown"
	}
	err := p.anonymousError(ss.Context(), method, p.forward(ss, method, info, known))
	p.m.request(label, err)
	return err
}

func (p *Proxy) forward(ss grpc.ServerStream, method string, info methodInfo, known bool) error {
	ctx, err := p.outgoing(ss.Context(), method)
	if err != nil {
		return err
	}
	if !known {
		if p.cfg.Mode == ReadOnly {
			p.m.refused.WithLabelValues("unknown").Inc()
			return status.Errorf(codes.Unimplemented, "proxy: this proxy is readonly: %s is not known to be a read and is refused", method)
		}
		return p.forwardStream(ctx, ss, method, true)
	}
	if info.stream {
		return p.forwardStream(ctx, ss, method, false)
	}
	req := new(frame)
	if err := ss.RecvMsg(req); err != nil {
		return err
	}
	resp, hdr, trl, err := p.unary(ctx, method, info, req)
	if err != nil {
		return err
	}
	if len(hdr) > 0 {
		_ = ss.SetHeader(hdr)
	}
	if len(trl) > 0 {
		ss.SetTrailer(trl)
	}
	return ss.SendMsg(resp)
}

// unary forwards one unary request (ctx carries the outgoing metadata).
func (p *Proxy) unary(ctx context.Context, method string, info methodInfo, req *frame) (*frame, metadata.MD, metadata.MD, error) {
	write := info.write || (info.isW != nil && info.isW(req.data))
	if write && p.cfg.Mode == ReadOnly {
		p.m.refused.WithLabelValues(method).Inc()
		return nil, nil, nil, readonlyError(method)
	}
	retry := info.retry || (info.isW != nil && !write)
	resp := new(frame)
	hdr, trl, err := p.invoke(ctx, method, req, resp, write, retry)
	if err != nil {
		return nil, nil, nil, err
	}
	if write && p.cache != nil {
		p.cache.wrote(resp.data) // reads through the proxy see it (read-your-writes)
	}
	return resp, hdr, trl, nil
}

// unaryHandler serves a known unary method on the server's unary path
// (cheaper than the generic stream path).
func (p *Proxy) unaryHandler(method string) grpc.MethodHandler {
	info := methods[method]
	return func(_ any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
		if err := p.notReady(); err != nil {
			p.m.request(method, err)
			return nil, err
		}
		if err := p.refuseAnonymous(ctx, method); err != nil { // anonymous.go
			p.m.request(method, err)
			return nil, err
		}
		resp, err := p.serveUnary(ctx, method, info, dec)
		err = p.anonymousError(ctx, method, err)
		p.m.request(method, err)
		if err != nil {
			return nil, err
		}
		return resp, nil
	}
}

func (p *Proxy) serveUnary(ctx context.Context, method string, info methodInfo, dec func(any) error) (any, error) {
	req := new(frame)
	if err := dec(req); err != nil {
		return nil, err
	}
	if method == kvSvc+"Range" && p.cache != nil {
		if resp, ok := p.cachedRange(ctx, req.data); ok {
			return resp, nil
		}
	}
	octx, err := p.outgoing(ctx, method)
	if err != nil {
		return nil, err
	}
	resp, hdr, trl, err := p.unary(octx, method, info, req)
	if err != nil {
		return nil, err
	}
	if len(hdr) > 0 {
		_ = grpc.SetHeader(ctx, hdr)
	}
	if len(trl) > 0 {
		_ = grpc.SetTrailer(ctx, trl)
	}
	return resp, nil
}

// serviceDescs describes the etcd services with their unary methods, so
// that those take the unary path; streaming methods not handled specially
// fall through to handleUnknown.
func (p *Proxy) serviceDescs() []*grpc.ServiceDesc {
	bySvc := map[string]*grpc.ServiceDesc{}
	for name, info := range methods {
		if info.stream {
			continue
		}
		i := strings.LastIndex(name, "/")
		svc, m := name[1:i], name[i+1:]
		d := bySvc[svc]
		if d == nil {
			d = &grpc.ServiceDesc{ServiceName: svc, HandlerType: (*any)(nil)}
			bySvc[svc] = d
		}
		d.Methods = append(d.Methods, grpc.MethodDesc{MethodName: m, Handler: p.unaryHandler(name)})
	}
	out := make([]*grpc.ServiceDesc, 0, len(bySvc))
	for _, d := range bySvc {
		out = append(out, d)
	}
	return out
}

// invoke makes one unary call upstream with ctx's outgoing metadata. A
// transport failure benches the endpoint; reads (retry) are then retried
// on the next endpoint, so a member going down fails no read that another
// member can serve.
func (p *Proxy) invoke(ctx context.Context, method string, req, resp any, write, retry bool) (hdr, trl metadata.MD, err error) {
	timeout := p.cfg.ReadTimeout
	if write {
		timeout = p.cfg.WriteTimeout
	}
	attempts := 1
	if retry {
		attempts = p.dir.knownCount() + 1
	}
	var last error
	for i := 0; i < attempts; i++ {
		if p.dir.availableCount() == 0 {
			if isLoopError(last) {
				return nil, nil, last
			}
			return nil, nil, p.noEndpointsError(last)
		}
		if i > 0 {
			p.m.retries.Inc()
		}
		// etcd sets no response metadata on its unary RPCs (everything is
		// in the response header message), so none is copied back.
		var pr peer.Peer
		var err error
		if timeout > 0 {
			cctx, cancel := context.WithTimeout(ctx, timeout)
			err = p.pickConn().Invoke(cctx, method, req, resp, p.forceCodec, grpc.Peer(&pr))
			cancel()
		} else {
			err = p.pickConn().Invoke(ctx, method, req, resp, p.forceCodec, grpc.Peer(&pr))
		}
		if err == nil {
			return hdr, trl, nil
		}
		last = err
		if ctx.Err() != nil {
			return nil, nil, status.FromContextError(ctx.Err()).Err()
		}
		switch {
		case isLoopError(err):
			if pr.Addr != nil {
				p.dir.markLoop(pr.Addr.String())
			}
		case isTransportError(err):
			if pr.Addr != nil {
				p.dir.fail(pr.Addr.String(), err)
			} else {
				p.dir.checkNow() // no member connected: which ones are down?
			}
		case isEtcdRetryable(err):
			// A member that is shutting down (removed from the cluster, or
			// stopped) answers "server stopped" until its listener closes:
			// bench it like a member that cannot be reached.
			if isStoppedError(err) && pr.Addr != nil {
				p.dir.fail(pr.Addr.String(), err)
			}
		default:
			return nil, nil, err
		}
	}
	if isTransportError(last) {
		if p.dir.availableCount() == 0 || retry {
			return nil, nil, p.noEndpointsError(last)
		}
		return nil, nil, status.Errorf(codes.Unavailable,
			"proxy: the member failed during the request, which was not retried because it may have been applied: %s", status.Convert(last).Message())
	}
	return nil, nil, last
}

// maxMsgSize bounds forwarded messages (etcd's own limit applies first).
const maxMsgSize = 1<<31 - 1

// forwardStream forwards a streaming RPC message by message. bidi streams
// keep forwarding client messages until the client closes its side.
func (p *Proxy) forwardStream(ctx context.Context, ss grpc.ServerStream, method string, bidi bool) error {
	if p.dir.availableCount() == 0 {
		return p.noEndpointsError(nil)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var pr peer.Peer
	desc := &grpc.StreamDesc{ServerStreams: true, ClientStreams: bidi}
	cs, err := p.pickConn().NewStream(ctx, desc, method, grpc.ForceCodecV2(p.codec), grpc.Peer(&pr))
	if err != nil {
		if isTransportError(err) {
			if pr.Addr == nil {
				p.dir.checkNow()
			}
			return p.noEndpointsError(err)
		}
		return err
	}
	if bidi {
		go func() {
			for {
				f := new(frame)
				if err := ss.RecvMsg(f); err != nil {
					if errors.Is(err, io.EOF) {
						_ = cs.CloseSend()
					} else {
						cancel()
					}
					return
				}
				if err := cs.SendMsg(f); err != nil {
					return
				}
			}
		}()
	} else {
		f := new(frame)
		if err := ss.RecvMsg(f); err != nil {
			return err
		}
		if err := cs.SendMsg(f); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		if err := cs.CloseSend(); err != nil {
			return err
		}
	}
	hdr, err := cs.Header()
	if err == nil && hdr != nil {
		_ = ss.SendHeader(hdr)
	}
	for {
		f := new(frame)
		if err := cs.RecvMsg(f); err != nil {
			ss.SetTrailer(cs.Trailer())
			if errors.Is(err, io.EOF) {
				return nil
			}
			if isTransportError(err) && pr.Addr != nil {
				p.dir.fail(pr.Addr.String(), err)
			}
			return err
		}
		if err := ss.SendMsg(f); err != nil {
			return err
		}
	}
}

// pickConn spreads requests over the upstream connections.
func (p *Proxy) pickConn() *grpc.ClientConn {
	if len(p.conns) == 1 {
		return p.conns[0]
	}
	return p.conns[p.next.Add(1)%uint32(len(p.conns))]
}
