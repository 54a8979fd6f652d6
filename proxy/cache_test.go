package proxy

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// TestCacheAnswersLikeEtcd: serializable ranges answered from the cache
// are exactly what etcd answers (keys, values, revisions, count, more)
// for every combination of range, limit, sort, keys-only, count-only and
// revision filters, over keys with several versions, deletions and
// leases.
func TestCacheAnswersLikeEtcd(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t, etcdtest.Options{})
	p := startProxy(t, Config{Endpoints: srv.Endpoints()})
	ctx := ctxT(t)
	direct := srv.Client(t)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 2))
	keys := make([]string, 60)
	for i := range keys {
		keys[i] = fmt.Sprintf("/c/%c/%02d", 'a'+rune(i%3), i)
	}
	lease, err := direct.Grant(ctx, 600)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 300 {
		k := keys[rng.IntN(len(keys))]
		switch {
		case i%17 == 0:
			if _, err := direct.Delete(ctx, k); err != nil {
				t.Fatal(err)
			}
		case i%5 == 0:
			if _, err := direct.Put(ctx, k, fmt.Sprint("v", rng.IntN(9)), clientv3.WithLease(lease.ID)); err != nil {
				t.Fatal(err)
			}
		default:
			if _, err := direct.Put(ctx, k, fmt.Sprint("v", rng.IntN(9))); err != nil {
				t.Fatal(err)
			}
		}
	}
	cli := proxyClient(t, p)
	// The first serializable read starts the cache; wait until it serves.
	eventually(t, "the cache serving", func() bool {
		if _, err := cli.Get(ctx, "/c/", clientv3.WithPrefix(), clientv3.WithSerializable()); err != nil {
			t.Fatal(err)
		}
		return value(t, p.m.cacheHits) > 0
	})
	ranges := [][]clientv3.OpOption{
		{clientv3.WithPrefix()},
		{clientv3.WithRange("/c/b")},
		{clientv3.WithFromKey()},
		{clientv3.WithRange("/c/a/03")}, // range end before the key: nothing
		{},                              // one key
	}
	from := []string{"/c/", "/c/a/", "/c/a/30", "/c/b/", "/c/zz"}
	targets := []clientv3.SortTarget{clientv3.SortByKey, clientv3.SortByVersion, clientv3.SortByCreateRevision, clientv3.SortByModRevision, clientv3.SortByValue}
	orders := []clientv3.SortOrder{clientv3.SortNone, clientv3.SortAscend, clientv3.SortDescend}
	rev, err := direct.Get(ctx, "/c/", clientv3.WithPrefix(), clientv3.WithSerializable())
	if err != nil {
		t.Fatal(err)
	}
	cur := rev.Header.Revision
	hits := value(t, p.m.cacheHits)
	const queries = 400
	for i := range queries {
		opts := append([]clientv3.OpOption{clientv3.WithSerializable()}, ranges[rng.IntN(len(ranges))]...)
		key := from[rng.IntN(len(from))]
		if rng.IntN(2) == 0 {
			key = keys[rng.IntN(len(keys))]
		}
		if rng.IntN(2) == 0 {
			opts = append(opts, clientv3.WithLimit(int64(rng.IntN(12))))
		}
		if rng.IntN(2) == 0 {
			opts = append(opts, clientv3.WithSort(targets[rng.IntN(len(targets))], orders[rng.IntN(len(orders))]))
		}
		switch rng.IntN(4) {
		case 0:
			opts = append(opts, clientv3.WithKeysOnly())
		case 1:
			opts = append(opts, clientv3.WithCountOnly())
		}
		if rng.IntN(3) == 0 {
			r := cur - int64(rng.IntN(200))
			switch rng.IntN(4) {
			case 0:
				opts = append(opts, clientv3.WithMinModRev(r))
			case 1:
				opts = append(opts, clientv3.WithMaxModRev(r))
			case 2:
				opts = append(opts, clientv3.WithMinCreateRev(r))
			case 3:
				opts = append(opts, clientv3.WithMaxCreateRev(r))
			}
		}
		want, err := direct.Get(ctx, key, opts...)
		if err != nil {
			t.Fatal(err)
		}
		got, err := cli.Get(ctx, key, opts...)
		if err != nil {
			t.Fatal(err)
		}
		w, g := (*pb.RangeResponse)(want), (*pb.RangeResponse)(got)
		if w.Header.Revision != g.Header.Revision || w.Header.ClusterId != g.Header.ClusterId {
			t.Fatalf("query %d: header %v, etcd %v", i, g.Header, w.Header)
		}
		w.Header, g.Header = nil, nil
		if !proto.Equal(w, g) {
			t.Fatalf("query %d (%q, %d options): cache\n%v\netcd\n%v", i, key, len(opts), g, w)
		}
	}
	if n := value(t, p.m.cacheHits) - hits; n != queries {
		t.Errorf("%v of %d queries answered from the cache", n, queries)
	}
}

// TestCacheFreshness: writes made straight to etcd reach the cache
// through its watch; writes through the proxy are visible to the next
// read through it; linearizable reads are never answered from the cache.
func TestCacheFreshness(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t, etcdtest.Options{})
	p := startProxy(t, Config{Endpoints: srv.Endpoints()})
	ctx := ctxT(t)
	cli := proxyClient(t, p)
	direct := srv.Client(t)
	eventually(t, "the cache serving", func() bool {
		if _, err := cli.Get(ctx, "/f", clientv3.WithSerializable()); err != nil {
			t.Fatal(err)
		}
		return value(t, p.m.cacheHits) > 0
	})
	// Written elsewhere: seen once the watch brings it (within the bound).
	if _, err := direct.Put(ctx, "/f", "direct"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the direct write in the cache", func() bool {
		r, err := cli.Get(ctx, "/f", clientv3.WithSerializable())
		if err != nil {
			t.Fatal(err)
		}
		return len(r.Kvs) == 1 && string(r.Kvs[0].Value) == "direct"
	})
	// Written through the proxy: the very next read sees it.
	for i := range 50 {
		v := fmt.Sprint("through-", i)
		if _, err := cli.Put(ctx, "/f", v); err != nil {
			t.Fatal(err)
		}
		r, err := cli.Get(ctx, "/f", clientv3.WithSerializable())
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Kvs) != 1 || string(r.Kvs[0].Value) != v {
			t.Fatalf("read after write %d: %v", i, r.Kvs)
		}
	}
	hits := value(t, p.m.cacheHits)
	for range 20 {
		if _, err := cli.Get(ctx, "/f"); err != nil {
			t.Fatal(err)
		}
	}
	if value(t, p.m.cacheHits) != hits {
		t.Error("linearizable reads were answered from the cache")
	}
}

// TestCacheOffWhenTooLarge: a keyspace larger than CacheMaxBytes turns the
// cache off; reads are forwarded and still right.
func TestCacheOffWhenTooLarge(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t, etcdtest.Options{})
	direct := srv.Client(t)
	ctx := ctxT(t)
	for i := range 20 {
		if _, err := direct.Put(ctx, fmt.Sprint("/big/", i), string(make([]byte, 1024))); err != nil {
			t.Fatal(err)
		}
	}
	p := startProxy(t, Config{Endpoints: srv.Endpoints(), CacheMaxBytes: 4096})
	cli := proxyClient(t, p)
	eventually(t, "the cache turned off", func() bool {
		r, err := cli.Get(ctx, "/big/", clientv3.WithPrefix(), clientv3.WithSerializable(), clientv3.WithCountOnly())
		if err != nil || r.Count != 20 {
			t.Fatalf("count %v, %v", r, err)
		}
		state, _, _, _, _ := p.cache.stats()
		return state == cacheDisabled
	})
	if value(t, p.m.cacheHits) != 0 {
		t.Error("answers from a cache over its size")
	}
}

func TestCacheable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tok := metadata.NewIncomingContext(ctx, metadata.Pairs(rpctypes.TokenFieldNameGRPC, "t"))
	gw := metadata.NewIncomingContext(ctx, metadata.Pairs("authorization", "t"))
	for _, tc := range []struct {
		ctx  context.Context
		req  *pb.RangeRequest
		want bool
	}{
		{ctx, &pb.RangeRequest{Key: []byte("k"), Serializable: true}, true},
		{ctx, &pb.RangeRequest{Key: []byte("k")}, false},
		{ctx, &pb.RangeRequest{Key: []byte("k"), Serializable: true, Revision: 3}, false},
		{ctx, &pb.RangeRequest{Serializable: true}, false},
		{ctx, &pb.RangeRequest{Key: []byte("k"), Serializable: true, SortOrder: 9}, false},
		{ctx, &pb.RangeRequest{Key: []byte("k"), Serializable: true, SortTarget: 9}, false},
		{tok, &pb.RangeRequest{Key: []byte("k"), Serializable: true}, false},
		{gw, &pb.RangeRequest{Key: []byte("k"), Serializable: true}, false},
	} {
		if got := cacheable(tc.ctx, tc.req); got != tc.want {
			t.Errorf("cacheable(%v) = %v", tc.req, got)
		}
	}
}

// FuzzHeaderRevision: the revision read from any encoded response is the
// one protobuf decodes, and no input breaks the reader.
func FuzzHeaderRevision(f *testing.F) {
	for _, m := range []proto.Message{
		&pb.PutResponse{Header: &pb.ResponseHeader{Revision: 42, MemberId: 7}},
		&pb.TxnResponse{Header: &pb.ResponseHeader{Revision: 1 << 40}, Succeeded: true},
		&pb.DeleteRangeResponse{Header: &pb.ResponseHeader{}, Deleted: 3},
	} {
		b, _ := proto.Marshal(m)
		f.Add(b)
	}
	f.Add([]byte{0x0a, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		got := headerRevision(b)
		var r pb.PutResponse
		if err := proto.Unmarshal(b, &r); err == nil && r.Header != nil && got != r.Header.Revision {
			// protobuf keeps the last header field; the reader reads the
			// first: only equal when there is one.
			if countField1(b) == 1 {
				t.Fatalf("revision %d, protobuf %d", got, r.Header.Revision)
			}
		}
	})
}

func countField1(b []byte) int {
	n := 0
	for len(b) > 0 {
		num, typ, l := protowireConsumeTag(b)
		if l < 0 {
			return n
		}
		b = b[l:]
		l = protowireConsumeFieldValue(num, typ, b)
		if l < 0 {
			return n
		}
		if num == 1 {
			n++
		}
		b = b[l:]
	}
	return n
}

var (
	protowireConsumeTag        = protowire.ConsumeTag
	protowireConsumeFieldValue = protowire.ConsumeFieldValue
)
