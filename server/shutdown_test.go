package server

import (
	"bufio"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon/backend"
	"github.com/beaconplane/beacon/internal/syncbuf"
	"github.com/beaconplane/beacon/server/registryapi"
)

// TestShutdownTellsWatchStreamsWhy: when the server shuts down, an open
// watch stream gets an error event saying so (code unavailable) before it
// ends, as docs/registry.md says, so that a client tells a shutdown from a
// broken connection. Before, it ended without a word.
func TestShutdownTellsWatchStreamsWhy(t *testing.T) {
	s := startServer(t, Config{HTTPAddr: "127.0.0.1:0", Backend: backend.Config{Name: backend.Memory}})
	req, err := http.NewRequest(http.MethodGet, s.Endpoints().HTTP+registryapi.WatchPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "text/event-stream")
	resp, err := (&http.Client{Timeout: time.Minute}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	lines := bufio.NewScanner(resp.Body)
	for lines.Scan() && !strings.HasPrefix(lines.Text(), "event: ") {
	} // the snapshot
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	var rest []string
	for lines.Scan() {
		rest = append(rest, lines.Text())
	}
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}
	got := strings.Join(rest, "\n")
	if !strings.Contains(got, "event: error\ndata: {\"code\":\"unavailable\"") || !strings.Contains(got, "shutting down") {
		t.Fatalf("the stream's end when the server shut down:\n%s", got)
	}
}

// TestShutdownCutsRequestsLeftAtTheTimeout: a request still open when
// the shutdown timeout passes (here a registration whose body never
// comes) is cut with a warning, and the stop succeeds: the timeout is
// what bounds a stop, and a client that sends (or reads) slowly cannot
// make it fail. Before, Close failed ("http shutdown: context deadline
// exceeded") and beacon serve exited 1.
func TestShutdownCutsRequestsLeftAtTheTimeout(t *testing.T) {
	logs := &syncbuf.Buffer{}
	s := startServer(t, Config{HTTPAddr: "127.0.0.1:0", Backend: backend.Config{Name: backend.Memory},
		ShutdownTimeout: 100 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	c, err := net.Dial("tcp", strings.TrimPrefix(s.Endpoints().HTTP, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Minute))
	fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\nExpect: 100-continue\r\n\r\n", registryapi.InstancesPath)
	// 100 Continue: the handler is reading the body, which never comes.
	if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || !strings.Contains(line, "100 Continue") {
		t.Fatalf("want 100 Continue once the handler reads: %q, %v", line, err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close with a request left at the shutdown timeout: %v", err)
	}
	if !strings.Contains(logs.String(), "still open when the shutdown timeout passed were cut") {
		t.Fatalf("no warning of the request cut; the log:\n%s", logs.String())
	}
}
