package xdsapi

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		// Every goroutine of a closed Server (its registry watch, streams
		// and their readers, the gRPC server) has ended; etcd and the
		// grpc-go xDS client leave a few of their own for a moment.
		opts := []goleak.Option{
			goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
			goleak.IgnoreAnyFunction("github.com/golang/glog.(*fileSink).flushDaemon"),
		}
		if err := goleak.Find(opts...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
