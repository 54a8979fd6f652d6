package nats_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/testkit/natstest"
	"github.com/beaconplane/beacon/internal/testkit/testpeer"
	"github.com/beaconplane/beacon/store"
	bnats "github.com/beaconplane/beacon/store/nats"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestConfigValidate(t *testing.T) {
	for name, c := range map[string]bnats.Config{
		"bad url":          {URL: "localhost:4222"},
		"bad scheme":       {URL: "http://localhost:4222"},
		"empty entry":      {URL: "nats://a:1,,nats://b:2"},
		"user only":        {User: "u"},
		"user and token":   {User: "u", Password: "p", Token: "t"},
		"cert without key": {CertFile: "/dev/null"},
		"missing ca":       {CAFile: "/nonexistent/ca.pem"},
		"bad bucket":       {Bucket: "a.b"},
		"replicas":         {Replicas: 7},
		"history":          {History: 2},
		"marker ttl":       {MarkerTTL: 1500 * time.Millisecond},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("%s: Validate(%+v) = nil", name, c)
		}
	}
	if err := (bnats.Config{}).Validate(); err != nil {
		t.Errorf("zero Config: %v", err)
	}
	t.Setenv(bnats.EnvURL, "nats://127.0.0.1:1")
	t.Setenv(bnats.EnvReplicas, "three")
	c, err := bnats.ConfigFromEnv()
	if err == nil || !strings.Contains(err.Error(), bnats.EnvReplicas) || c.URL != "nats://127.0.0.1:1" || c.Validate() == nil {
		t.Fatalf("ConfigFromEnv with a bad %s: %+v, %v", bnats.EnvReplicas, c, err)
	}
	// Every error about a value read from the environment names its
	// variable (a replica count out of range and a missing file did not).
	for env, val := range map[string]string{bnats.EnvReplicas: "9", bnats.EnvCreds: "/nonexistent/creds",
		bnats.EnvCA: "/nonexistent/ca.pem", bnats.EnvURL: "http://127.0.0.1:4222", bnats.EnvBucket: "a.b"} {
		t.Run(env, func(t *testing.T) {
			t.Setenv(bnats.EnvReplicas, "")
			t.Setenv(bnats.EnvURL, "")
			t.Setenv(env, val)
			_, err := bnats.ConfigFromEnv()
			if want := env + "=" + strconv.Quote(val); err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("ConfigFromEnv with %s=%s: %v, want an error naming %s", env, val, err, want)
			}
		})
	}
	// 0 replicas silently meant the default, 1.
	t.Setenv(bnats.EnvURL, "")
	t.Setenv(bnats.EnvReplicas, "0")
	if _, err := bnats.ConfigFromEnv(); err == nil || !strings.Contains(err.Error(), bnats.EnvReplicas+`="0": want a number from 1 to 5`) {
		t.Fatalf("ConfigFromEnv with %s=0: %v", bnats.EnvReplicas, err)
	}
}

func TestUnreachableServer(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	start := time.Now()
	_, err = bnats.Open(ctxT(t, 10*time.Second), bnats.Config{URL: "nats://" + addr, DialTimeout: time.Second})
	if !errors.Is(err, store.ErrUnavailable) || !strings.Contains(err.Error(), addr) {
		t.Fatalf("Open of an unreachable server: %v", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("Open took %v to fail", took)
	}
}

func TestAuthentication(t *testing.T) {
	t.Run("UserPassword", func(t *testing.T) {
		srv := natstest.Start(t, natstest.Options{User: "beacon", Password: "s3cret"})
		s := natstest.Open(t, bnats.Config{URL: srv.ClientURL(), User: "beacon", Password: "s3cret"})
		defer s.Close()
		if _, err := s.Put(ctxT(t, 5*time.Second), "/a", []byte("v")); err != nil {
			t.Fatal(err)
		}
		_, err := bnats.Open(ctxT(t, 5*time.Second), bnats.Config{URL: srv.ClientURL(), User: "beacon", Password: "wrong"})
		if err == nil || !strings.Contains(strings.ToLower(err.Error()), "authorization") {
			t.Fatalf("wrong password: %v", err)
		}
	})
	t.Run("Token", func(t *testing.T) {
		srv := natstest.Start(t, natstest.Options{Token: "tok"})
		s := natstest.Open(t, bnats.Config{URL: srv.ClientURL(), Token: "tok"})
		defer s.Close()
		if _, err := s.Put(ctxT(t, 5*time.Second), "/a", []byte("v")); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("TLS", func(t *testing.T) {
		srv := natstest.Start(t, natstest.Options{TLS: true})
		c := srv.Certs()
		s := natstest.Open(t, bnats.Config{URL: srv.URL(), CAFile: c.CA, CertFile: c.ClientCert, KeyFile: c.ClientKey})
		defer s.Close()
		if _, err := s.Put(ctxT(t, 5*time.Second), "/a", []byte("v")); err != nil {
			t.Fatal(err)
		}
		if _, err := bnats.Open(ctxT(t, 5*time.Second), bnats.Config{URL: srv.URL(), CAFile: c.CA, DialTimeout: time.Second}); err == nil {
			t.Fatal("TLS without a client certificate was accepted")
		}
	})
	t.Run("Domain", func(t *testing.T) {
		srv := natstest.Start(t, natstest.Options{Domain: "hub"})
		s := natstest.Open(t, bnats.Config{URL: srv.ClientURL(), Domain: "hub"})
		defer s.Close()
		rev, err := s.Put(ctxT(t, 5*time.Second), "/a", []byte("v"))
		if err != nil {
			t.Fatal(err)
		}
		if kv, err := s.Get(ctxT(t, 5*time.Second), "/a"); err != nil || kv.ModRevision != rev {
			t.Fatalf("Get through a domain: %+v, %v", kv, err)
		}
	})
}

func TestIncompatibleBuckets(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx := ctxT(t, 20*time.Second)
	// A KV bucket made by something else.
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "foreign"}); err != nil {
		t.Fatal(err)
	}
	_, err = bnats.Open(ctx, bnats.Config{URL: srv.ClientURL(), Bucket: "foreign"})
	if !errors.Is(err, bnats.ErrIncompatibleBucket) || !strings.Contains(err.Error(), "not created by Beacon") {
		t.Fatalf("foreign bucket: %v", err)
	}
	// A Beacon bucket whose settings were changed.
	s := natstest.Open(t, bnats.Config{URL: srv.ClientURL(), Bucket: "edited"})
	s.Close()
	st, err := js.Stream(ctx, "KV_edited")
	if err != nil {
		t.Fatal(err)
	}
	for what, edit := range map[string]func(*jetstream.StreamConfig){
		"revisions per key": func(c *jetstream.StreamConfig) { c.MaxMsgsPerSubject = 1 },
		"bucket TTL":        func(c *jetstream.StreamConfig) { c.MaxAge = time.Hour },
		"refuses messages":  func(c *jetstream.StreamConfig) { c.MaxMsgSize = 64 << 10 },
	} {
		cfg := st.CachedInfo().Config
		edit(&cfg)
		if _, err := js.UpdateStream(ctx, cfg); err != nil {
			t.Fatal(err)
		}
		_, err = bnats.Open(ctx, bnats.Config{URL: srv.ClientURL(), Bucket: "edited"})
		if !errors.Is(err, bnats.ErrIncompatibleBucket) || !strings.Contains(err.Error(), strings.Fields(what)[0]) {
			t.Fatalf("bucket with changed %s: %v", what, err)
		}
		if _, err := js.UpdateStream(ctx, st.CachedInfo().Config); err != nil {
			t.Fatal(err)
		}
	}
	// The markers' TTL of an existing bucket is the shortest lease.
	cfg := st.CachedInfo().Config
	cfg.SubjectDeleteMarkerTTL = 5 * time.Second
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	s = natstest.Open(t, bnats.Config{URL: srv.ClientURL(), Bucket: "edited"})
	defer s.Close()
	l, err := s.Grant(ctx, time.Second)
	if err != nil || l.TTL != 5*time.Second {
		t.Fatalf("Grant(1s) in a bucket with 5s markers: %+v, %v", l, err)
	}
}

// A server whose max_payload is below the value limit is refused at Open,
// rather than failing the first large write.
func TestSmallMaxPayload(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{Configure: func(o *server.Options) { o.MaxPayload = 64 << 10 }})
	_, err := bnats.Open(ctxT(t, 10*time.Second), bnats.Config{URL: srv.ClientURL()})
	if !errors.Is(err, bnats.ErrIncompatibleServer) || !strings.Contains(err.Error(), "max_payload is 65536 bytes") {
		t.Fatalf("Open against a server with a 64 KiB max_payload: %v", err)
	}
}

// A server without per-message TTLs (Debian's 2.9) is refused with the
// version Beacon needs.
func TestServerTooOld(t *testing.T) {
	bin := testpeer.Binary(t, "apt-get install nats-server", "nats-server", "/usr/sbin/nats-server")
	out, err := testpeer.Command(bin, "--version").Output()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), "v2.9") && !strings.Contains(string(out), "v2.10") {
		t.Skipf("%s is %s: not an old server", bin, strings.TrimSpace(string(out)))
	}
	dir := t.TempDir()
	cmd := testpeer.Command(bin, "-js", "-a", "127.0.0.1", "-p", "-1", "-sd", filepath.Join(dir, "js"), "-ports_file_dir", dir)
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	// The server logs its client port when ready.
	var url string
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		if _, after, ok := strings.Cut(sc.Text(), "Listening for client connections on "); ok {
			url = "nats://" + strings.TrimSpace(after)
			break
		}
	}
	go func() {
		for sc.Scan() {
		}
	}()
	if url == "" {
		t.Fatal("old nats-server did not start")
	}
	_, err = bnats.Open(ctxT(t, 10*time.Second), bnats.Config{URL: url})
	if !errors.Is(err, bnats.ErrServerTooOld) || !strings.Contains(err.Error(), bnats.MinServerVersion) {
		t.Fatalf("Open against %s: %v", strings.TrimSpace(string(out)), err)
	}
	t.Log(err)
}

// Keys with every kind of byte survive the subject encoding, and prefixes
// that end inside a segment still list exactly the matching keys.
func TestOddKeys(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	s := natstest.Open(t, bnats.Config{URL: srv.ClientURL()})
	defer s.Close()
	ctx := ctxT(t, 20*time.Second)
	keys := []string{"/odd/a.b", "/odd/a b", "/odd/a*", "/odd/a>", "/odd/a=", "/odd//x", "/odd/ü", "/odd/a/", "/odd/ab"}
	for _, k := range keys {
		if _, err := s.Put(ctx, k, []byte(k)); err != nil {
			t.Fatalf("Put(%q): %v", k, err)
		}
		if kv, err := s.Get(ctx, k); err != nil || string(kv.Value) != k {
			t.Fatalf("Get(%q): %q, %v", k, kv.Value, err)
		}
	}
	kvs, _, err := s.List(ctx, "/odd/a")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, kv := range kvs {
		got = append(got, kv.Key)
	}
	want := []string{"/odd/a b", "/odd/a*", "/odd/a.b", "/odd/a/", "/odd/a=", "/odd/a>", "/odd/ab"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("List(/odd/a) = %q, want %q", got, want)
	}
}

// More keys than one server read returns (1024) are listed in chunks.
func TestListBeyondOneRead(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	s := natstest.Open(t, bnats.Config{URL: srv.ClientURL()})
	defer s.Close()
	ctx := ctxT(t, 60*time.Second)
	const n = 1100
	var last int64
	for i := range n {
		var err error
		if last, err = s.Put(ctx, fmt.Sprintf("/many/%04d", i), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	kvs, rev, err := s.List(ctx, "/many/")
	if err != nil || len(kvs) != n || rev < last {
		t.Fatalf("List of %d keys: %d keys at %d (last write %d), %v", n, len(kvs), rev, last, err)
	}
}

// Per-key history is bounded: a watch that needs a dropped revision of a
// key says so instead of skipping it.
func TestDroppedHistoryIsCompaction(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	s := natstest.Open(t, bnats.Config{URL: srv.ClientURL(), Bucket: "short", History: bnats.MinHistory})
	defer s.Close()
	ctx := ctxT(t, 20*time.Second)
	first, err := s.Put(ctx, "/h/k", []byte("0"))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 * bnats.MinHistory {
		if _, err := s.Put(ctx, "/h/k", []byte(fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	resp := <-s.Watch(ctx, "/h/", first)
	if !errors.Is(resp.Err, store.ErrCompacted) {
		t.Fatalf("watch from a dropped revision: %+v", resp)
	}
}

// A process that stops (without revoking) loses its keys when its lease
// expires, all at one revision; a watch from before, started after the
// server's marker of that expiry is gone, reports compaction instead of
// missing the deletions.
func TestCrashedClientKeysExpire(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	watcher := natstest.Open(t, bnats.Config{URL: srv.ClientURL()})
	defer watcher.Close()
	ctx := ctxT(t, 30*time.Second)
	_, rev, err := watcher.List(ctx, "/crash/")
	if err != nil {
		t.Fatal(err)
	}
	w := watcher.Watch(ctx, "/crash/", rev+1)
	crashed := natstest.Open(t, bnats.Config{URL: srv.ClientURL()})
	l, err := crashed.Grant(ctx, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"/crash/a", "/crash/b"} {
		if _, err := crashed.Put(ctx, k, []byte("v"), store.WithLease(l.ID)); err != nil {
			t.Fatal(err)
		}
	}
	crashed.Close() // no Revoke: the keys stay until the lease expires
	var dels []store.Event
	for len(dels) < 2 {
		select {
		case resp := <-w:
			if resp.Err != nil {
				t.Fatal(resp.Err)
			}
			for _, e := range resp.Events {
				if e.Type == store.EventDelete {
					dels = append(dels, e)
				}
			}
		case <-ctx.Done():
			t.Fatal("keys of the stopped client never expired")
		}
	}
	if dels[0].Revision() != dels[1].Revision() {
		t.Fatalf("expiry at two revisions: %v", dels)
	}
	// Wait until the expiry marker (TTL 1s) is gone: then a watch from
	// before cannot know when the keys went. No event marks the marker's
	// removal, so start a new watch at every tick, up to a deadline.
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(10 * time.Second)
	for {
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, ok := <-watcher.Watch(wctx, "/crash/", rev+1)
		cancel()
		if errors.Is(resp.Err, store.ErrCompacted) {
			break
		}
		if !ok || resp.Err != nil {
			t.Fatalf("watch from before the expiry: %+v (open %v)", resp, ok)
		}
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatal("a watch from before an expiry whose marker is gone was not reported as compacted")
		}
	}
	kvs, _, err := watcher.List(ctx, "/crash/")
	if err != nil || len(kvs) != 0 {
		t.Fatalf("after expiry: %v, %v", kvs, err)
	}
}

// A transaction is one revision: its keys all carry it, and a watch that
// starts anywhere inside it (its messages have consecutive sequences)
// gets all its events in one response.
func TestTransactionIsOneRevision(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	s := natstest.Open(t, bnats.Config{URL: srv.ClientURL()})
	defer s.Close()
	ctx := ctxT(t, 20*time.Second)
	l, err := s.Grant(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	before, err := s.Put(ctx, "/tx/a", []byte("0"))
	if err != nil {
		t.Fatal(err)
	}
	rev, err := s.Txn(ctx,
		store.Op{Kind: store.OpPut, Key: "/tx/a", Value: []byte("1"), IfModRevision: before},
		store.Op{Kind: store.OpPut, Key: "/tx/b", Value: []byte("1"), Lease: l.ID, IfAbsent: true},
		store.Op{Kind: store.OpPut, Key: "/tx/c", Value: []byte("1")})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"/tx/a", "/tx/b", "/tx/c"} {
		if kv, err := s.Get(ctx, k); err != nil || kv.ModRevision != rev {
			t.Fatalf("Get(%s) after the transaction at %d: %+v, %v", k, rev, kv, err)
		}
	}
	for from := before + 1; from <= rev; from++ {
		resp := <-s.Watch(ctx, "/tx/", from)
		if resp.Err != nil || len(resp.Events) != 3 {
			t.Fatalf("watch from %d (transaction at %d): %+v", from, rev, resp)
		}
		for _, e := range resp.Events {
			if e.Revision() != rev {
				t.Fatalf("watch from %d: event %s at %d, want %d", from, e.KV.Key, e.Revision(), rev)
			}
		}
	}
	if _, err := s.Update(ctx, "/tx/c", []byte("2"), rev); err != nil {
		t.Fatalf("Update at the transaction's revision: %v", err)
	}
	// Revoking the lease deletes the transaction's leased key.
	if err := s.Revoke(ctx, l.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "/tx/b"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("leased key after revoke: %v", err)
	}
}

// When the server goes away, writes fail with store.ErrUnavailable after
// the request timeout and watches end with it: nothing hangs or goes
// silent.
func TestServerGone(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	s := natstest.Open(t, bnats.Config{URL: srv.ClientURL(), RequestTimeout: time.Second})
	defer s.Close()
	ctx := ctxT(t, 30*time.Second)
	w := s.Watch(ctx, "/gone/", 0)
	if _, err := s.Put(ctx, "/gone/k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if resp := <-w; resp.Err != nil || len(resp.Events) != 1 {
		t.Fatalf("before the server went: %+v", resp)
	}
	srv.Stop()
	start := time.Now()
	if _, err := s.Put(ctx, "/gone/k", []byte("v2")); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Put without a server: %v", err)
	}
	select {
	case resp, ok := <-w:
		if !ok || !errors.Is(resp.Err, store.ErrUnavailable) {
			t.Fatalf("watch without a server: %+v (open %v)", resp, ok)
		}
		t.Logf("watch ended %v after the server stopped: %v", time.Since(start).Round(time.Millisecond), resp.Err)
	case <-ctx.Done():
		t.Fatal("watch went silent when the server stopped")
	}
}
