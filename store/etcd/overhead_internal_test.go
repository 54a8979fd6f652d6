package etcd

import (
	"context"
	"testing"
	"time"

	"github.com/beaconplane/beacon/store"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// BenchmarkOverhead measures what the Store adds to a unary call on the
// client, without a server: the watchdog's bookkeeping for a call without
// a deadline, and input validation plus converting a result.
func BenchmarkOverhead(b *testing.B) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"http://127.0.0.1:1"}, Logger: zap.NewNop()})
	if err != nil {
		b.Fatal(err)
	}
	defer cli.Close()
	s := newStore(cli, false, resolved{endpoints: []string{"http://127.0.0.1:1"}, requestTimeout: 5 * time.Second})
	defer s.Close()
	ctx := context.Background()
	b.Run("begin-end", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			c, tc, _ := s.begin(ctx)
			_ = c.Done() // grpc asks for Done
			s.wd.end(tc)
		}
	})
	b.Run("begin-end-nodone", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, tc, _ := s.begin(ctx)
			s.wd.end(tc)
		}
	})
	kv := &mvccpb.KeyValue{Key: []byte("/services/prod/api/http/00000000000000a1"), Value: make([]byte, 256), CreateRevision: 1, ModRevision: 2}
	b.Run("validate+fromKV", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := store.ValidateKey(string(kv.Key)); err != nil {
				b.Fatal(err)
			}
			_ = fromKV(kv)
		}
	})
}
