package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon/server/registryapi"
	"github.com/miekg/dns"
)

// A dead instance leaves every consumer of `beacon serve` — DNS and the
// SSE watch — by its own registrant's lease TTL, whatever the server's:
// this server's registry has a one-hour TTL (a removal hold derived from
// it would keep the dead listed 20 minutes, past the deadlines here),
// its registrants (HTTP registrations) two seconds (a hold of at most
// 2.7 s). First a burst: six registrations' leases revoked together, as
// etcd revokes a rack's leases in one tick. Then the server is closed and
// started again on its data, its registrants gone meanwhile: the
// restarted server lists them at first (etcd extends every lease when it
// comes back) and must drop them from DNS and from a new SSE stream by
// their own TTL too.
func TestDeadInstancesLeaveDNSAndSSEByTheirTTL(t *testing.T) {
	cfg := testConfig(t)
	cfg.DNS = DNSConfig{Addr: "127.0.0.1:0"}
	cfg.Registry.LeaseTTL = time.Hour
	s := startServer(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const n = 6

	// A burst of deaths while DNS and an SSE stream watch.
	regs := registerHTTP(t, ctx, s.Endpoints().HTTP, "rack", n)
	sse := openSSE(t, ctx, s.Endpoints().HTTP, "rack")
	sse.waitFor(t, "the snapshot of the six", func() bool { return len(sse.live) == n })
	waitDNS(t, ctx, s, "http.web.rack.beacon.", n)
	for _, r := range regs {
		req, err := http.NewRequestWithContext(ctx, http.MethodDelete, s.Endpoints().HTTP+registryapi.InstancesPath+"/"+r.ref, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set(registryapi.SecretHeader, r.secret)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent && resp.StatusCode != http.StatusOK {
			t.Fatalf("deregister %s: %s", r.ref, resp.Status)
		}
	}
	sse.waitFor(t, "every removal on the SSE stream", func() bool { return len(sse.live) == 0 })
	waitDNS(t, ctx, s, "http.web.rack.beacon.", 0)
	// Held (a burst), then delivered: by each watch of the registry (DNS
	// watches every namespace, the SSE stream this one).
	_, body := get(t, s.Endpoints().HTTP+"/metrics")
	var held int
	if _, err := fmt.Sscanf(grepLines(body, `beacon_registry_watch_held_removals_total{outcome="delivered"}`),
		`beacon_registry_watch_held_removals_total{outcome="delivered"} %d`, &held); err != nil || held < n {
		t.Errorf("the burst was not held and delivered (%d held, %v):\n%s", held, err, grepLines(body, "held_removals"))
	}
	sse.close()

	// The server is killed and restarted; its registrants died meanwhile.
	registerHTTP(t, ctx, s.Endpoints().HTTP, "restart", n)
	waitDNS(t, ctx, s, "http.web.restart.beacon.", n)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := startServer(t, cfg)
	sse = openSSE(t, ctx, s2.Endpoints().HTTP, "restart")
	sse.waitFor(t, "the snapshot after the restart", func() bool { return sse.snapshots > 0 })
	t.Logf("listed after the restart: SSE %d, etcd extended their leases", len(sse.live))
	sse.waitFor(t, "the dead gone from the SSE stream after the restart", func() bool { return len(sse.live) == 0 })
	waitDNS(t, ctx, s2, "http.web.restart.beacon.", 0)
	sse.close()
}

// httpReg is one registration made over the HTTP API.
type httpReg struct{ ref, secret string }

// registerHTTP registers n instances of web/http in ns over the HTTP API,
// each with a 2 s lease of its own, and heartbeats none of them.
func registerHTTP(t *testing.T, ctx context.Context, base, ns string, n int) []httpReg {
	t.Helper()
	var out []httpReg
	for i := range n {
		body := fmt.Sprintf(`{"namespace":%q,"component":"web","endpoint":"http","address":"10.1.0.%d:80","ttl":"2s"}`, ns, i+1)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+registryapi.InstancesPath, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var rr registryapi.RegisterResponse
		err = json.NewDecoder(resp.Body).Decode(&rr)
		_ = resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusCreated {
			t.Fatalf("register: %s, %v", resp.Status, err)
		}
		out = append(out, httpReg{ref: rr.Instance.Ref().String(), secret: rr.Secret})
	}
	return out
}

// waitDNS waits until name has want A records, on each change of the DNS
// server's view.
func waitDNS(t *testing.T, ctx context.Context, s *Server, name string, want int) {
	t.Helper()
	for {
		updated := s.DNS().Updated()
		m := new(dns.Msg)
		m.SetQuestion(name, dns.TypeA)
		r, _, err := (&dns.Client{Timeout: 5 * time.Second}).ExchangeContext(ctx, m, s.DNSAddr())
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Answer) == want {
			return
		}
		select {
		case <-updated:
		case <-ctx.Done():
			t.Fatalf("DNS answers %d records for %s, want %d: %v", len(r.Answer), name, want, ctx.Err())
		}
	}
}

// sseView follows an SSE watch: frames are read by a goroutine and
// applied by waitFor, in the test's goroutine.
type sseView struct {
	ctx       context.Context
	cancel    context.CancelFunc
	frames    chan sseFrame
	live      map[string]bool // instance refs listed
	snapshots int
	failure   string // the data of the error event, if any
}

type sseFrame struct {
	event string
	data  []byte
}

func openSSE(t *testing.T, ctx context.Context, base, ns string) *sseView {
	t.Helper()
	return openSSEAs(t, ctx, base, ns, "")
}

// openSSEAs is openSSE with the Authorization header auth (none if
// empty).
func openSSEAs(t *testing.T, ctx context.Context, base, ns, auth string) *sseView {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+registryapi.WatchPath+"?namespace="+ns, nil)
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("watch: %s", resp.Status)
	}
	v := &sseView{ctx: ctx, cancel: cancel, frames: make(chan sseFrame), live: map[string]bool{}}
	go func() {
		defer close(v.frames)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<20)
		var f sseFrame
		for sc.Scan() {
			line := sc.Bytes()
			switch {
			case len(line) == 0 && f.event != "":
				select {
				case v.frames <- f:
				case <-ctx.Done():
					return
				}
				f = sseFrame{}
			case bytes.HasPrefix(line, []byte("event: ")):
				f.event = string(line[len("event: "):])
			case bytes.HasPrefix(line, []byte("data: ")):
				f.data = append([]byte(nil), line[len("data: "):]...)
			}
		}
	}()
	return v
}

func (v *sseView) close() { v.cancel() }

// waitFor applies frames until cond holds, or fails at the test's
// deadline.
func (v *sseView) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case f, ok := <-v.frames:
			if !ok {
				t.Fatalf("waiting for %s: the SSE stream ended (%v)", what, v.ctx.Err())
			}
			switch f.event {
			case "snapshot":
				var m registryapi.SnapshotMessage
				if err := json.Unmarshal(f.data, &m); err != nil {
					t.Fatalf("snapshot %s: %v", f.data, err)
				}
				v.snapshots++
				clear(v.live)
				for _, in := range m.Instances {
					v.live[in.Ref().String()] = true
				}
			case "error":
				v.failure = string(f.data)
			case "added", "updated", "removed":
				var m registryapi.EventMessage
				if err := json.Unmarshal(f.data, &m); err != nil {
					t.Fatalf("%s %s: %v", f.event, f.data, err)
				}
				v.live[m.Instance.Ref().String()] = f.event != "removed"
				if f.event == "removed" {
					delete(v.live, m.Instance.Ref().String())
				}
			}
		case <-v.ctx.Done():
			t.Fatalf("waiting for %s: %v (listed: %v)", what, v.ctx.Err(), v.live)
		}
	}
}
