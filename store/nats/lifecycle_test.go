package nats_test

import (
	"errors"
	"net"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/testkit/natstest"
	"github.com/beaconplane/beacon/store"
	bnats "github.com/beaconplane/beacon/store/nats"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// muteServer replaces srv, on the same port, with a server whose
// JetStream API takes every request and answers none, as a server that
// hangs does. It returns the subjects of the requests as they come.
func muteServer(t *testing.T, srv *natstest.Server) <-chan string {
	t.Helper()
	port := srv.Addr().(*net.TCPAddr).Port
	srv.Stop()
	mute := natstest.Start(t, natstest.Options{Configure: func(o *server.Options) {
		o.Port = port
		o.JetStream = false
	}})
	nc, err := nats.Connect(mute.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	got := make(chan string, 1024)
	if _, err := nc.Subscribe("$JS.API.>", func(m *nats.Msg) {
		select {
		case got <- m.Subject:
		default:
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return got
}

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
	requests := muteServer(t, srv)
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
