package etcd_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// prefix returns a key prefix no other test uses.
func prefix(t testing.TB) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "/etcdtest/" + strings.ReplaceAll(t.Name(), "/", "-") + "-" + hex.EncodeToString(b[:]) + "/"
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func recv(t *testing.T, w store.WatchChan) store.WatchResponse {
	t.Helper()
	select {
	case resp, ok := <-w:
		if !ok {
			t.Fatal("watch closed")
		}
		return resp
	case <-time.After(15 * time.Second):
		t.Fatal("no watch response")
	}
	return store.WatchResponse{}
}

// TestNewFromClient: the Store uses the injected client, Close does not
// close it, and a client closed by its owner gives ErrClosed.
func TestNewFromClient(t *testing.T) {
	ctx, p := testCtx(t), prefix(t)
	cli := server.Client(t)
	s := etcd.NewFromClient(cli)
	if s.Client() != cli {
		t.Fatal("Client() is not the injected client")
	}
	rev, err := s.Put(ctx, p+"k", []byte("v"))
	if err != nil {
		t.Fatal(err)
	}
	w := s.Watch(ctx, p, rev)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for resp := range w { // Close ends the watch
		if resp.Err != nil {
			t.Fatalf("watch ended by Close with %v", resp.Err)
		}
	}
	if _, err := s.Get(ctx, p+"k"); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("Get after Close: %v", err)
	}
	if resp, err := cli.Get(ctx, p+"k"); err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("the injected client no longer works after Close: %v", err)
	}

	// Its owner closes the client under a second Store.
	cli2, err := clientv3.New(server.ClientConfig())
	if err != nil {
		t.Fatal(err)
	}
	s2 := etcd.NewFromClient(cli2)
	defer s2.Close()
	w2 := s2.Watch(ctx, p, 0)
	_ = cli2.Close()
	if resp := recv(t, w2); !errors.Is(resp.Err, store.ErrClosed) {
		t.Fatalf("watch after its client closed: %+v", resp)
	}
	if _, err := s2.Get(ctx, p+"k"); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("Get after its client closed: %v", err)
	}
}

func TestGrantRoundsUpAndReportsGrantedTTL(t *testing.T) {
	s, ctx := newStore(t, nil, etcd.Config{}), testCtx(t)
	for _, tc := range []struct{ ask, want time.Duration }{
		{time.Second, 2 * time.Second}, // etcd's minimum with the default election timeout
		{2500 * time.Millisecond, 3 * time.Second},
		{time.Minute, time.Minute},
	} {
		l, err := s.Grant(ctx, tc.ask)
		if err != nil {
			t.Fatal(err)
		}
		if l.TTL != tc.want {
			t.Errorf("Grant(%v) granted %v, want %v", tc.ask, l.TTL, tc.want)
		}
		if ttl, err := s.KeepAlive(ctx, l.ID); err != nil || ttl != tc.want {
			t.Errorf("KeepAlive of a %v lease: %v, %v", tc.want, ttl, err)
		}
		if err := s.Revoke(ctx, l.ID); err != nil {
			t.Fatal(err)
		}
	}
}

// TestListPagesAreOneSnapshot lists in pages of 7 while a writer changes
// the prefix: the result is exactly the state at the returned revision.
func TestListPagesAreOneSnapshot(t *testing.T) {
	s, ctx, p := newStore(t, nil, etcd.Config{ListPageSize: 7}), testCtx(t), prefix(t)
	for i := range 50 {
		if _, err := s.Put(ctx, fmt.Sprintf("%sk%03d", p, i), []byte("v0")); err != nil {
			t.Fatal(err)
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			k := fmt.Sprintf("%sk%03d", p, i%80) // updates and new keys
			if i%5 == 4 {
				_, _ = s.Delete(ctx, k)
			} else if _, err := s.Put(ctx, k, []byte(fmt.Sprint("v", i))); err != nil {
				return
			}
		}
	}()
	defer func() { close(stop); wg.Wait() }()
	cli := server.Client(t)
	for range 5 {
		kvs, rev, err := s.List(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		want, err := cli.Get(ctx, p, clientv3.WithPrefix(), clientv3.WithRev(rev))
		if err != nil {
			t.Fatal(err)
		}
		if len(kvs) != len(want.Kvs) {
			t.Fatalf("List at %d gave %d keys, the snapshot holds %d", rev, len(kvs), len(want.Kvs))
		}
		for i, kv := range kvs {
			w := want.Kvs[i]
			if kv.Key != string(w.Key) || string(kv.Value) != string(w.Value) || kv.ModRevision != w.ModRevision {
				t.Fatalf("List at %d: %s=%s@%d, snapshot %s=%s@%d", rev, kv.Key, kv.Value, kv.ModRevision, w.Key, w.Value, w.ModRevision)
			}
		}
	}
}

// TestWholeKeyspace: the empty prefix lists and watches every key,
// including keys that sort before "/".
func TestWholeKeyspace(t *testing.T) {
	s, ctx, p := newStore(t, nil, etcd.Config{}), testCtx(t), prefix(t)
	keys := []string{"\x01" + p, "!" + p, p + "k", "~" + p}
	w := s.Watch(ctx, "", 0)
	seen := map[string]bool{}
	for _, k := range keys {
		if _, err := s.Put(ctx, k, []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	for len(seen) < len(keys) { // other tests write too: pick ours out
		resp := recv(t, w)
		if resp.Err != nil {
			t.Fatal(resp.Err)
		}
		for _, e := range resp.Events {
			if strings.Contains(e.KV.Key, p) {
				seen[e.KV.Key] = true
			}
		}
	}
	kvs, _, err := s.List(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	for _, kv := range kvs {
		if strings.Contains(kv.Key, p) {
			found++
		}
	}
	if found != len(keys) {
		t.Fatalf("List(\"\") holds %d of our %d keys", found, len(keys))
	}
}

// TestRevisionZeroPreconditions: an absent key has ModRevision 0 in etcd's
// compares; Update and conditional Delete must not treat that as a match.
func TestRevisionZeroPreconditions(t *testing.T) {
	s, ctx, p := newStore(t, nil, etcd.Config{}), testCtx(t), prefix(t)
	if _, err := s.Update(ctx, p+"absent", []byte("v"), 0); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Update(absent, 0): %v", err)
	}
	if _, err := s.Get(ctx, p+"absent"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Update(absent, 0) wrote the key: %v", err)
	}
	if _, err := s.Put(ctx, p+"k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Update(ctx, p+"k", []byte("v"), 0); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("Update(present, 0): %v", err)
	}
	if _, err := s.Delete(ctx, p+"k", store.IfModRevision(-1)); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("Delete(present, IfModRevision(-1)): %v", err)
	}
	_, err := s.Txn(ctx, store.Op{Kind: store.OpPut, Key: p + "absent", IfModRevision: -1})
	var ce *store.ConflictError
	if !errors.As(err, &ce) || !errors.Is(ce.Err, store.ErrNotFound) || ce.Key != p+"absent" {
		t.Fatalf("Txn(absent, IfModRevision(-1)): %v", err)
	}
}

func TestTxnOverEtcdLimit(t *testing.T) {
	s, ctx, p := newStore(t, nil, etcd.Config{}), testCtx(t), prefix(t)
	ops := make([]store.Op, 200)
	for i := range ops {
		ops[i] = store.Op{Kind: store.OpPut, Key: fmt.Sprintf("%s%d", p, i)}
	}
	_, err := s.Txn(ctx, ops...)
	if err == nil || !strings.Contains(err.Error(), "--max-txn-ops") {
		t.Fatalf("Txn of 200 ops: %v", err)
	}
	if kvs, _, _ := s.List(ctx, p); len(kvs) != 0 {
		t.Fatalf("a refused transaction wrote %d keys", len(kvs))
	}
}

// TestInteropWithRawClient: keys are stored verbatim, so etcdctl and any
// etcd client see what the Store writes and the other way round; a raw
// multi-key transaction reaches a Store watch as one response.
func TestInteropWithRawClient(t *testing.T) {
	s, ctx, p := newStore(t, nil, etcd.Config{}), testCtx(t), prefix(t)
	cli := server.Client(t)
	rev, err := s.Put(ctx, p+"from-store", []byte("a"))
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := cli.Get(ctx, p+"from-store"); err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "a" || resp.Kvs[0].ModRevision != rev {
		t.Fatalf("raw Get of a Store write: %v, %v", resp, err)
	}
	w := s.Watch(ctx, p, rev+1)
	tr, err := cli.Txn(ctx).Then(clientv3.OpPut(p+"x", "1"), clientv3.OpPut(p+"y", "2"), clientv3.OpDelete(p+"from-store")).Commit()
	if err != nil {
		t.Fatal(err)
	}
	resp := recv(t, w)
	if resp.Err != nil || len(resp.Events) != 3 {
		t.Fatalf("raw transaction reached the watch as %+v", resp)
	}
	for _, e := range resp.Events {
		if e.Revision() != tr.Header.Revision {
			t.Fatalf("event %s@%d, transaction at %d", e.KV.Key, e.Revision(), tr.Header.Revision)
		}
	}
	if d := resp.Events[2]; d.Type != store.EventDelete || d.KV.Key != p+"from-store" || d.KV.Value != nil {
		t.Fatalf("delete event %+v", d)
	}
	if kv, err := s.Get(ctx, p+"y"); err != nil || string(kv.Value) != "2" || kv.CreateRevision != tr.Header.Revision {
		t.Fatalf("Store Get of a raw write: %+v, %v", kv, err)
	}
}

// TestContextCancelIsNotUnavailable: a call the caller cancels reports the
// cancellation, not an outage.
func TestContextCancelIsNotUnavailable(t *testing.T) {
	s := newStore(t, nil, etcd.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := s.Get(ctx, "/k")
	if !errors.Is(err, context.Canceled) || errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Get with a cancelled context: %v", err)
	}
}

// TestGetLocal: the serializable read returns what Get returns, and
// ErrNotFound for an absent key.
func TestGetLocal(t *testing.T) {
	s := newStore(t, nil, etcd.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rev, err := s.Put(ctx, "/local/k", []byte("v"))
	if err != nil {
		t.Fatal(err)
	}
	kv, err := s.GetLocal(ctx, "/local/k")
	if err != nil || string(kv.Value) != "v" || kv.ModRevision != rev {
		t.Fatalf("GetLocal: %+v, %v (put at %d)", kv, err, rev)
	}
	if _, err := s.GetLocal(ctx, "/local/absent"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("GetLocal of an absent key: %v", err)
	}
}

// TestProbedWithOneEndpoint: a store of one endpoint has nothing to choose
// between: Probed is closed at once, and nothing is ever left out.
func TestProbedWithOneEndpoint(t *testing.T) {
	s := newStore(t, nil, etcd.Config{})
	var fo store.Failover = s
	select {
	case <-fo.Probed():
	default:
		t.Fatal("Probed of a one-endpoint store is not closed")
	}
	if fo.ExcludedChanged() != nil || len(s.Excluded()) != 0 {
		t.Fatalf("a one-endpoint store leaves out %v", s.Excluded())
	}
}

// TestOpenRefusesEtcdTooOld: Open refuses Debian's etcd 3.4 with
// ErrServerTooOld, naming the version and what to do. Before, beacon
// serve fronting it said it was ready, then answered every registry
// request 503 (AuthStatus is unimplemented before 3.5).
func TestOpenRefusesEtcdTooOld(t *testing.T) {
	t.Parallel()
	ep := etcdtest.StartDebianEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := etcd.Open(ctx, etcd.Config{Endpoints: []string{ep}})
	if err == nil {
		_ = s.Close()
		t.Fatal("Open of etcd 3.4 succeeded")
	}
	if !errors.Is(err, etcd.ErrServerTooOld) || !strings.Contains(err.Error(), "etcd 3.4.") || !strings.Contains(err.Error(), "upgrade") {
		t.Fatalf("Open of etcd 3.4: %v; want ErrServerTooOld naming the version and what to do", err)
	}
}
