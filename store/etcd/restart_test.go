package etcd_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/etcd"
)

// nextEvent waits for the next response of w and checks that it is the
// one event key@rev.
func nextEvent(t *testing.T, w store.WatchChan, key string, rev int64) {
	t.Helper()
	select {
	case resp, ok := <-w:
		if !ok || resp.Err != nil || len(resp.Events) != 1 || resp.Events[0].KV.Key != key || resp.Events[0].Revision() != rev {
			t.Fatalf("watch delivered %+v (open %v), want only %s@%d", resp, ok, key, rev)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("watch did not deliver %s@%d", key, rev)
	}
}

// TestStopAndRestart stops etcd under a Store: every call fails with
// ErrUnavailable by its deadline (or RequestTimeout), watches stay open and
// silent, and once etcd is back, calls work again and watches resume where
// they stopped, without a gap or a repeat. (This is the etcd client's
// resume, which the silence check would cut short after
// WatchSilenceTimeout: it is disabled here; TestWatchSilentWhileDown checks
// the default.)
//
// It runs in parallel with the other tests that start their own server,
// after the conformance suites (whose leak checks must run alone).
func TestStopAndRestart(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t, etcdtest.Options{})
	const requestTimeout = 500 * time.Millisecond
	s := newStore(t, srv, etcd.Config{RequestTimeout: requestTimeout, WatchSilenceTimeout: -1})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	r1, err := s.Put(ctx, "/r/a", []byte("1"))
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.Grant(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	_, listed, err := s.List(ctx, "/r/")
	if err != nil {
		t.Fatal(err)
	}
	fromRev := s.Watch(ctx, "/r/", listed+1)
	fromNow := s.Watch(ctx, "/r/", 0)
	r2, err := s.Put(ctx, "/r/b", []byte("2"), store.WithLease(l.ID))
	if err != nil {
		t.Fatal(err)
	}
	nextEvent(t, fromRev, "/r/b", r2)
	nextEvent(t, fromNow, "/r/b", r2)

	// etcd's graceful stop waits (7 s) for the open watch streams.
	srv.Stop()

	// Every call fails, by the caller's deadline or by RequestTimeout.
	short := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, 300*time.Millisecond) }
	calls := map[string]func(context.Context) error{
		"Get":    func(c context.Context) error { _, err := s.Get(c, "/r/a"); return err },
		"List":   func(c context.Context) error { _, _, err := s.List(c, "/r/"); return err },
		"Put":    func(c context.Context) error { _, err := s.Put(c, "/r/x", nil); return err },
		"Create": func(c context.Context) error { _, err := s.Create(c, "/r/x", nil); return err },
		"Update": func(c context.Context) error { _, err := s.Update(c, "/r/a", nil, r1); return err },
		"Delete": func(c context.Context) error { _, err := s.Delete(c, "/r/a"); return err },
		"Txn": func(c context.Context) error {
			_, err := s.Txn(c, store.Op{Kind: store.OpDelete, Key: "/r/a"})
			return err
		},
		"Grant":     func(c context.Context) error { _, err := s.Grant(c, time.Minute); return err },
		"KeepAlive": func(c context.Context) error { _, err := s.KeepAlive(c, l.ID); return err },
		"Revoke":    func(c context.Context) error { return s.Revoke(c, l.ID) },
	}
	var wg sync.WaitGroup
	for name, call := range calls {
		for _, deadline := range []bool{true, false} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, limit := context.Background(), requestTimeout
				if deadline {
					var cancel context.CancelFunc
					c, cancel = short()
					defer cancel()
					limit = 300 * time.Millisecond
				}
				start := time.Now()
				err := call(c)
				took := time.Since(start)
				what := fmt.Sprintf("%s (deadline %v) while etcd is down", name, deadline)
				switch {
				case !errors.Is(err, store.ErrUnavailable):
					t.Errorf("%s: %v, want ErrUnavailable", what, err)
				case !strings.Contains(err.Error(), srv.Endpoint()):
					t.Errorf("%s: error %q does not name the endpoint", what, err)
				case took > limit+time.Second:
					t.Errorf("%s took %v, limit %v", what, took, limit)
				}
			}()
		}
	}
	// A watch from now made while etcd is down returns within
	// RequestTimeout (it starts once etcd is back).
	wg.Add(1)
	go func() {
		defer wg.Done()
		start := time.Now()
		s.Watch(ctx, "/r/", 0)
		if took := time.Since(start); took > requestTimeout+time.Second {
			t.Errorf("Watch from now took %v while etcd was down", took)
		}
	}()
	wg.Wait()
	// The watches neither delivered nor ended.
	for _, w := range []store.WatchChan{fromRev, fromNow} {
		select {
		case resp, ok := <-w:
			t.Fatalf("watch delivered %+v (open %v) while etcd was down", resp, ok)
		default:
		}
	}

	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	// The first call waits for the client to reconnect (its context
	// allows it), then everything works again.
	r3, err := s.Put(ctx, "/r/c", []byte("3"))
	if err != nil {
		t.Fatalf("Put after restart: %v", err)
	}
	nextEvent(t, fromRev, "/r/c", r3)
	nextEvent(t, fromNow, "/r/c", r3)
	if ttl, err := s.KeepAlive(ctx, l.ID); err != nil || ttl != time.Minute {
		t.Fatalf("KeepAlive after restart: %v, %v", ttl, err)
	}
	if kv, err := s.Get(ctx, "/r/b"); err != nil || kv.ModRevision != r2 {
		t.Fatalf("Get after restart: %+v, %v", kv, err)
	}
}
