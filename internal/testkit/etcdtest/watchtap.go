package etcdtest

import (
	"context"
	"testing"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
)

// WatchTap tells when etcd has created the watches of the clients it taps
// (DialOption): it sees each Created response on their watch streams. A
// client's Watch returns, and a proxy confirms a watch, before etcd has
// created it, so a test that must act after the creation (a compaction)
// waits for it here — on its own clients, unlike Watchers, which counts
// every server's watchers in the process, moved late by other tests'
// cancellations.
type WatchTap struct {
	created chan struct{}
}

// NewWatchTap returns a tap that has seen nothing.
func NewWatchTap() *WatchTap {
	return &WatchTap{created: make(chan struct{}, 1<<10)}
}

// DialOption taps a client's watch streams (clientv3.Config.DialOptions).
func (w *WatchTap) DialOption() grpc.DialOption {
	return grpc.WithChainStreamInterceptor(w.intercept)
}

func (w *WatchTap) intercept(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string,
	streamer grpc.Streamer, opts ...grpc.CallOption,
) (grpc.ClientStream, error) {
	cs, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil || method != "/etcdserverpb.Watch/Watch" {
		return cs, err
	}
	return &tappedStream{ClientStream: cs, created: w.created}, nil
}

// tappedStream is one watch stream of a tapped client.
type tappedStream struct {
	grpc.ClientStream
	created chan<- struct{}
}

func (s *tappedStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if wr, ok := m.(*etcdserverpb.WatchResponse); ok && err == nil && wr.Created {
		select {
		case s.created <- struct{}{}:
		default: // more than a test waits for
		}
	}
	return err
}

// WaitCreated waits until etcd has created n more watches of the tapped
// clients than were waited for before, failing the test when ctx ends
// first, or when fail (which may be nil) reports an error: the watch under
// test ended, say.
func (w *WatchTap) WaitCreated(ctx context.Context, tb testing.TB, n int, fail <-chan error) {
	tb.Helper()
	for i := range n {
		select {
		case <-w.created:
		case err := <-fail:
			tb.Fatalf("waiting for etcd to create watch %d of %d: %v", i+1, n, err)
		case <-ctx.Done():
			tb.Fatalf("etcd created %d of %d watches: %v", i, n, context.Cause(ctx))
		}
	}
}
