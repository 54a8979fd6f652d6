package connlimit

import (
	"context"
	"net"

	"google.golang.org/grpc/stats"
)

// GRPCMarks returns, for a gRPC server serving ln (a Listener with
// Config.Marked), a stats handler (grpc.StatsHandler) that marks each RPC
// as a request in flight on its connection from its start to its end: a
// connection with a stream open is never closed to make room (unless its
// client stops reading), one that never carried an RPC is silent, and one
// whose RPCs all ended is idle, as on an HTTP server. It returns nil for
// any other listener.
func GRPCMarks(ln net.Listener) stats.Handler {
	l, ok := ln.(*listener)
	if !ok || !l.opts.Marked {
		return nil
	}
	return grpcMarks{l}
}

type grpcMarks struct{ l *listener }

// TagConn finds the listener's connection by its client's address (one
// connection per address and port at a time) and keeps it for the RPCs.
func (g grpcMarks) TagConn(ctx context.Context, info *stats.ConnTagInfo) context.Context {
	if info.RemoteAddr == nil {
		return ctx
	}
	g.l.mu.Lock()
	c := g.l.byAddr[info.RemoteAddr.String()]
	g.l.mu.Unlock()
	if c == nil {
		return ctx
	}
	return context.WithValue(ctx, connKey{}, c)
}

func (grpcMarks) HandleConn(context.Context, stats.ConnStats) {}

func (grpcMarks) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }

// HandleRPC marks the RPC in flight at its beginning and done at its end
// (gRPC reports each once per RPC).
func (grpcMarks) HandleRPC(ctx context.Context, s stats.RPCStats) {
	c, _ := ctx.Value(connKey{}).(*conn)
	if c == nil {
		return
	}
	switch s.(type) {
	case *stats.Begin:
		c.begin()
	case *stats.End:
		c.end()
	}
}
