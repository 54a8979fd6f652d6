package server

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/beaconplane/beacon/backend"
	"github.com/beaconplane/beacon/store/file"
)

// TestRequestEndsAtItsTimeout: what a request waits for ends with
// --http-request-timeout. A file store's lock held by a stopped process
// left POST /v1/registry/instances unanswered for 44.7 s with a 30 s
// timeout (socket deadlines alone do not end the handler), and the
// registration was applied once the lock was free, long after its client
// had given up: its secret never received, the instance advertised for
// its whole TTL. Now it is answered 503 at the timeout, saying why, and
// nothing is written.
func TestRequestEndsAtItsTimeout(t *testing.T) {
	dir := t.TempDir()
	s := startServer(t, Config{HTTPAddr: "127.0.0.1:0",
		Backend:  backend.Config{Name: backend.File, File: file.Config{Dir: dir}},
		Security: Security{RequestTimeout: time.Second}})
	// Another process's hold on the store's lock, as a SIGSTOPped one
	// keeps it.
	lock, err := os.Open(filepath.Join(dir, "lock"))
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	base := s.Endpoints().HTTP + "/v1/registry/instances"
	c := &http.Client{Timeout: 20 * time.Second} // the old server never answered
	resp, err := c.Post(base, "application/json",
		strings.NewReader(`{"namespace":"ns","component":"c","endpoint":"e","address":"10.0.0.1:80","ttl":"60s"}`))
	if err != nil {
		t.Fatal(err)
	}
	var body struct{ Code, Message string }
	_ = json.NewDecoder(resp.Body).Decode(&body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body.Message, "took longer than 1s (Config.Security.RequestTimeout)") ||
		!strings.Contains(body.Message, "lock") {
		t.Fatalf("a registration waiting on a held lock: %d %+v, want 503 saying the request timed out on the lock", resp.StatusCode, body)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_UN); err != nil {
		t.Fatal(err)
	}
	code, list := get(t, base)
	if code != http.StatusOK || strings.Contains(list, "10.0.0.1:80") {
		t.Fatalf("after the lock was freed: %d %s, want the timed-out registration never written", code, list)
	}
}
