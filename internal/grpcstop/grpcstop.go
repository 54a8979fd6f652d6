// Package grpcstop holds the one way Beacon stops a gRPC server: calls get
// a grace to finish (GracefulStop: no new call is accepted, and clients
// are told to go elsewhere), then whatever is still open is ended (Stop).
//
// Watch, keep-alive and ADS streams do not end by themselves, so a
// GracefulStop alone can wait forever; a Stop alone cuts the connection
// under streams whose handlers were about to return a status saying why,
// and their clients see "EOF" instead.
package grpcstop

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc"
)

// Stop stops servers gracefully and, after grace (at once when abort is
// done), ends every call still open. It returns once every server has
// stopped, and reports whether calls were left to end.
func Stop(abort context.Context, grace time.Duration, servers ...*grpc.Server) (cut bool) {
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		var wg sync.WaitGroup
		for _, gs := range servers {
			wg.Go(gs.GracefulStop)
		}
		wg.Wait()
	}()
	timer := time.NewTimer(grace)
	defer timer.Stop()
	select {
	case <-drained:
		return false
	case <-timer.C:
	case <-abort.Done():
	}
	for _, gs := range servers {
		gs.Stop() // ends the graceful stops too
	}
	<-drained
	return true
}
