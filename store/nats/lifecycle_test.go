package nats_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/syncbuf"
	"github.com/beaconplane/beacon/internal/testkit/natstest"
	"github.com/beaconplane/beacon/store"
	bnats "github.com/beaconplane/beacon/store/nats"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestCloseEndsWhateverTheServerDoes: Close ends every wait of the store,
// however long the server takes to answer. jetstream's ordered consumer
// re-created itself after a reconnect with requests no context of the
// store ended, retried forever, and Close waited for the watch: beacon
// watch and beacon serve ignored SIGINT and SIGTERM.
func TestCloseEndsWhateverTheServerDoes(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	// A request timeout longer than the test's deadline: only Close can
	// end the requests in time.
	s := natstest.Open(t, bnats.Config{URL: srv.ClientURL(), RequestTimeout: time.Minute})
	ctx := ctxT(t, 30*time.Second)
	w := s.Watch(ctx, "/close/", 0)
	if _, err := s.Put(ctx, "/close/k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if resp := <-w; resp.Err != nil || len(resp.Events) != 1 {
		t.Fatalf("before the server hung: %+v", resp)
	}
	requests := natstest.Hang(t, srv)
	// The watch asks the mute server for something once it has
	// reconnected.
	select {
	case subj := <-requests:
		t.Logf("the hung server got %s", subj)
	case <-ctx.Done():
		t.Fatal("the store never reconnected to the hung server")
	}
	put := make(chan error, 1)
	go func() {
		_, err := s.Put(ctx, "/close/k", []byte("v2"))
		put <- err
	}()
	select { // the Put waits for the server too
	case <-requests:
	case <-ctx.Done():
		t.Fatal("the Put never reached the hung server")
	}
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("Close waited for a server that does not answer")
	}
	select {
	case err := <-put:
		if !errors.Is(err, store.ErrClosed) {
			t.Fatalf("Put in flight when the store closed: %v, want store.ErrClosed", err)
		}
	case <-ctx.Done():
		t.Fatal("a Put in flight outlived Close")
	}
	for resp := range w {
		if resp.Err != nil && !errors.Is(resp.Err, store.ErrClosed) {
			t.Fatalf("watch after Close: %+v", resp)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// TestReaderDoesNotCreateBucket: a store that only reads (MustExist)
// refuses a bucket that does not exist, naming it and saying what creates
// one, and creates nothing: a mistyped BEACON_NATS_BUCKET listed "(no
// instances)" and left a new stream behind.
func TestReaderDoesNotCreateBucket(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	ctx := ctxT(t, 20*time.Second)
	_, err := bnats.Open(ctx, bnats.Config{URL: srv.ClientURL(), Bucket: "bekon", MustExist: true})
	if !errors.Is(err, bnats.ErrNoBucket) || !strings.Contains(err.Error(), `"bekon"`) || !strings.Contains(err.Error(), "created by the first program that writes") {
		t.Fatalf("reader Open of a missing bucket: %v", err)
	}
	js := jsClient(t, srv)
	if _, err := js.Stream(ctx, "KV_bekon"); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("a reader created the bucket: %v", err)
	}
	natstest.Open(t, bnats.Config{URL: srv.ClientURL(), Bucket: "bekon"}) // a writer creates it
	r := natstest.Open(t, bnats.Config{URL: srv.ClientURL(), Bucket: "bekon", MustExist: true})
	if kvs, _, err := r.List(ctx, "/"); err != nil || len(kvs) != 0 {
		t.Fatalf("reader List of an existing empty bucket: %v, %v", kvs, err)
	}
}

func jsClient(t *testing.T, srv *natstest.Server) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// endsWith waits for the watch to end with an error matching want.
func endsWith(t *testing.T, ctx context.Context, w store.WatchChan, want error) error {
	t.Helper()
	for {
		select {
		case resp, ok := <-w:
			if !ok {
				t.Fatal("the watch closed without an error")
			}
			if resp.Err != nil {
				if !errors.Is(resp.Err, want) {
					t.Fatalf("the watch ended with %v, want %v", resp.Err, want)
				}
				return resp.Err
			}
		case <-ctx.Done():
			t.Fatal("the watch went stale")
		}
	}
}

// TestWriterRecreatesLostBucket: when the bucket goes away while the
// stores run (nats-server restarted without its JetStream data), a store
// that writes creates it again with Open's settings and says so, so that
// registrants find their lease gone and register again, and watches end
// (their clients list again); a reader names the missing bucket and
// creates nothing. Nothing re-created it: keep-alives failed with "no
// responders" until an unrelated Open did.
func TestWriterRecreatesLostBucket(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	var logs syncbuf.Buffer
	w := natstest.Open(t, bnats.Config{URL: srv.ClientURL(), Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	r := natstest.Open(t, bnats.Config{URL: srv.ClientURL(), MustExist: true})
	ctx := ctxT(t, 60*time.Second)
	js := jsClient(t, srv)
	l, err := w.Grant(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Put(ctx, "/lost/a", []byte("v"), store.WithLease(l.ID)); err != nil {
		t.Fatal(err)
	}
	rw := r.Watch(ctx, "/lost/", 0)
	if err := js.DeleteStream(ctx, "KV_beacon"); err != nil {
		t.Fatal(err)
	}

	// The reader names the bucket, and its watch ends; neither creates it.
	if _, _, err := r.List(ctx, "/lost/"); !errors.Is(err, store.ErrUnavailable) || !errors.Is(err, bnats.ErrNoBucket) || !strings.Contains(err.Error(), `"beacon"`) {
		t.Fatalf("reader List of a lost bucket: %v", err)
	}
	t.Log(endsWith(t, ctx, rw, bnats.ErrNoBucket))
	if _, err := js.Stream(ctx, "KV_beacon"); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("a reader created the lost bucket again: %v", err)
	}

	// The writer's next request creates it again, with Open's settings.
	if _, err := w.KeepAlive(ctx, l.ID); !errors.Is(err, store.ErrUnavailable) || !strings.Contains(err.Error(), `bucket "beacon" was gone`) {
		t.Fatalf("keep-alive in a lost bucket: %v", err)
	}
	if !strings.Contains(logs.String(), "gone from the NATS server (restarted without its JetStream data?): created it again") {
		t.Fatalf("re-creation not logged:\n%s", logs.String())
	}
	st, err := js.Stream(ctx, "KV_beacon")
	if err != nil {
		t.Fatal(err)
	}
	if c := st.CachedInfo().Config; c.MaxMsgsPerSubject != bnats.DefaultHistory || !c.AllowMsgTTL || !c.AllowAtomicPublish || c.SubjectDeleteMarkerTTL != bnats.DefaultMarkerTTL {
		t.Fatalf("bucket created again with other settings: %+v", c)
	}
	// The lease went with the bucket: its owner registers again.
	if _, err := w.KeepAlive(ctx, l.ID); !errors.Is(err, store.ErrLeaseNotFound) {
		t.Fatalf("keep-alive of a lease the lost bucket held: %v", err)
	}
	if kvs, _, err := r.List(ctx, "/lost/"); err != nil || len(kvs) != 0 {
		t.Fatalf("reader List of the bucket created again: %v, %v", kvs, err)
	}

	// A writer's watch ends too, and its failure creates the bucket again.
	ww := w.Watch(ctx, "/lost/", 0)
	if err := js.DeleteStream(ctx, "KV_beacon"); err != nil {
		t.Fatal(err)
	}
	t.Log(endsWith(t, ctx, ww, store.ErrUnavailable))
	if _, err := js.Stream(ctx, "KV_beacon"); err != nil {
		t.Fatalf("the bucket after a writer's watch found it gone: %v", err)
	}
}

// TestRestartWithoutDataRecreatesBucket: the case the tester found. After
// nats-server restarts without its JetStream data, a registrant's
// keep-alive finds its lease gone (its store created the bucket again)
// instead of failing with "no responders" until an unrelated Open.
func TestRestartWithoutDataRecreatesBucket(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	s := natstest.Open(t, bnats.Config{URL: srv.ClientURL(), RequestTimeout: 2 * time.Second})
	ctx := ctxT(t, 60*time.Second)
	l, err := s.Grant(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(ctx, "/restart/a", []byte("v"), store.WithLease(l.ID)); err != nil {
		t.Fatal(err)
	}
	srv = natstest.Replace(t, srv, natstest.Options{}) // without its JetStream data
	// Each keep-alive ends within the request timeout; the first ones may
	// find the store still reconnecting, or the bucket gone.
	for attempt := 1; ; attempt++ {
		_, err := s.KeepAlive(ctx, l.ID)
		if errors.Is(err, store.ErrLeaseNotFound) {
			break
		}
		if !errors.Is(err, store.ErrUnavailable) || attempt == 10 {
			t.Fatalf("keep-alive %d after the server lost its data: %v", attempt, err)
		}
		t.Logf("keep-alive %d: %v", attempt, err)
	}
	if _, err := jsClient(t, srv).Stream(ctx, "KV_beacon"); err != nil {
		t.Fatalf("the bucket after the restart: %v", err)
	}
}
