package registryapi

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store/memory"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newAPI serves the API over a registry on a memory store, on a real HTTP
// server on loopback.
func newAPI(t *testing.T) (*httptest.Server, *registry.StoreRegistry) {
	t.Helper()
	reg := newRegistryForTest(t)
	return serveAPI(t, reg), reg
}

// serveAPI serves the API over reg on a real HTTP server on loopback,
// closed with the test (before reg).
func serveAPI(t *testing.T, reg *registry.StoreRegistry) *httptest.Server {
	t.Helper()
	h, err := New(reg, Config{KeepAliveInterval: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return newServer(t, h)
}

type reply struct {
	code   int
	body   []byte
	header http.Header
}

func (r reply) decode(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("decode %s: %v", r.body, err)
	}
}

// wantError checks an error reply's status and code.
func (r reply) wantError(t *testing.T, status int, code string) ErrorResponse {
	t.Helper()
	var e ErrorResponse
	if r.code != status {
		t.Fatalf("status %d, want %d: %s", r.code, status, r.body)
	}
	r.decode(t, &e)
	if e.Code != code || e.Message == "" {
		t.Fatalf("error %+v, want code %q and a message", e, code)
	}
	return e
}

func do(t *testing.T, method, url, body string) reply {
	t.Helper()
	return doSecret(t, method, url, body, "")
}

// doSecret is do with a Beacon-Secret header (none when secret is empty).
func doSecret(t *testing.T, method, url, body, secret string) reply {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if secret != "" {
		req.Header.Set(SecretHeader, secret)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return reply{resp.StatusCode, b, resp.Header}
}

func register(t *testing.T, base, body string) RegisterResponse {
	t.Helper()
	r := do(t, "POST", base+InstancesPath, body)
	if r.code != http.StatusCreated {
		t.Fatalf("register: %d %s", r.code, r.body)
	}
	var out RegisterResponse
	r.decode(t, &out)
	return out
}

func instanceURL(base string, in beacon.Instance) string {
	return base + InstancesPath + "/" + in.Ref().String()
}

func TestRegisterListGetHeartbeatUpdateDeregister(t *testing.T) {
	srv, _ := newAPI(t)
	base := srv.URL
	reg := register(t, base, `{"namespace":"prod","component":"api","endpoint":"http","address":"10.0.0.1:80","metadata":{"zone":"a"},"ttl":"30s"}`)
	if beacon.ValidateID(reg.Instance.ID) != nil || reg.Lease == "" || len(reg.Secret) < 22 || reg.TTLSeconds != 30 || reg.Instance.Status != beacon.StatusServing {
		t.Fatalf("registration: %+v", reg)
	}

	var list ListResponse
	do(t, "GET", base+InstancesPath+"?namespace=prod&component=api", "").decode(t, &list)
	if len(list.Instances) != 1 || list.Instances[0].ID != reg.Instance.ID || list.Revision == 0 {
		t.Fatalf("list: %+v", list)
	}
	do(t, "GET", base+InstancesPath+"?namespace=other", "").decode(t, &list)
	if len(list.Instances) != 0 || list.Instances == nil {
		t.Fatalf("list of another namespace: %+v", list)
	}

	var got beacon.Instance
	do(t, "GET", instanceURL(base, reg.Instance), "").decode(t, &got)
	if !got.Equal(reg.Instance) {
		t.Fatalf("get: %+v, want %+v", got, reg.Instance)
	}

	hb := doSecret(t, "POST", instanceURL(base, reg.Instance)+"/heartbeat", "", reg.Secret)
	if hb.code != 200 || !strings.Contains(string(hb.body), `"ttl_seconds":30`) {
		t.Fatalf("heartbeat: %d %s", hb.code, hb.body)
	}

	up := doSecret(t, "PATCH", instanceURL(base, reg.Instance), `{"address":"10.0.0.2:80","status":"draining"}`, reg.Secret)
	if up.code != 200 || len(up.header.Values("Warning")) != 0 {
		t.Fatalf("update: %d %s, warnings %q", up.code, up.body, up.header.Values("Warning"))
	}
	// Routing metadata DNS and xDS cannot read is taken with a Warning
	// header each (the answer's body is the instance); before, none.
	weird := doSecret(t, "PATCH", instanceURL(base, reg.Instance), `{"metadata":{"zone":"a","weight":"abc","lb_policy":"x"}}`, reg.Secret)
	if ws := weird.header.Values("Warning"); weird.code != 200 || len(ws) != 2 || !strings.HasPrefix(ws[0], `299 - "metadata weight='abc' is not 0-65535`) {
		t.Fatalf("update with unreadable routing metadata: %d %s, warnings %q", weird.code, weird.body, ws)
	}
	up.decode(t, &got)
	if got.Address != "10.0.0.2:80" || got.Status != beacon.StatusDraining || got.Metadata["zone"] != "a" {
		t.Fatalf("updated: %+v", got)
	}
	do(t, "GET", base+InstancesPath+"?status=serving", "").decode(t, &list)
	if len(list.Instances) != 0 {
		t.Fatalf("status=serving lists a draining instance: %+v", list)
	}

	if r := doSecret(t, "DELETE", instanceURL(base, reg.Instance), "", reg.Secret); r.code != http.StatusNoContent {
		t.Fatalf("deregister: %d %s", r.code, r.body)
	}
	do(t, "GET", instanceURL(base, reg.Instance), "").wantError(t, 404, "not_found")
	doSecret(t, "DELETE", instanceURL(base, reg.Instance), "", reg.Secret).wantError(t, 404, "not_found")
	// The lease ended with the deregistration: heartbeats are refused.
	doSecret(t, "POST", instanceURL(base, reg.Instance)+"/heartbeat", "", reg.Secret).wantError(t, 404, "not_found")
}

func TestBadInput(t *testing.T) {
	srv, _ := newAPI(t)
	base := srv.URL
	good := register(t, base, `{"namespace":"prod","component":"api","endpoint":"http","id":"00000000000000a1","address":"10.0.0.1:80"}`)
	tests := []struct {
		name, method, path, body string
		status                   int
		code, mention            string
	}{
		{"bad namespace", "POST", InstancesPath, `{"namespace":"Prod","component":"api","endpoint":"http","address":"h:1"}`, 400, "invalid_argument", "namespace"},
		{"bad address", "POST", InstancesPath, `{"namespace":"prod","component":"api","endpoint":"http","address":"nowhere"}`, 400, "invalid_argument", "address"},
		{"metadata over 4 KiB", "POST", InstancesPath, `{"namespace":"prod","component":"api","endpoint":"http","address":"h:1","metadata":{"k":"` + strings.Repeat("v", 4096) + `"}}`, 400, "invalid_argument", "metadata"},
		{"ttl too short", "POST", InstancesPath, `{"namespace":"prod","component":"api","endpoint":"http","address":"h:1","ttl":"500ms"}`, 400, "invalid_argument", "ttl"},
		{"ttl too long", "POST", InstancesPath, `{"namespace":"prod","component":"api","endpoint":"http","address":"h:1","ttl":7200}`, 400, "invalid_argument", "ttl"},
		{"ttl garbage", "POST", InstancesPath, `{"namespace":"prod","component":"api","endpoint":"http","address":"h:1","ttl":"soon"}`, 400, "invalid_argument", "ttl"},
		{"ttl 1e308", "POST", InstancesPath, `{"namespace":"prod","component":"api","endpoint":"http","address":"h:1","ttl":1e308}`, 400, "invalid_argument", "ttl: registry: invalid lease TTL: 1e308 seconds is outside [1s, 1h0m0s]"},
		{"ttl -1e400", "POST", InstancesPath, `{"namespace":"prod","component":"api","endpoint":"http","address":"h:1","ttl":-1e400}`, 400, "invalid_argument", "-1e400 seconds is outside [1s, 1h0m0s]"},
		{"ttl 9999999999h", "POST", InstancesPath, `{"namespace":"prod","component":"api","endpoint":"http","address":"h:1","ttl":"9999999999h"}`, 400, "invalid_argument", `"9999999999h" is outside [1s, 1h0m0s]`},
		// encoding/json keeps the last of two keys and matches field
		// names in any letter case: both are refused, naming the key.
		{"duplicate key", "POST", InstancesPath, `{"namespace":"prod","component":"api","endpoint":"http","address":"h:1","address":"h:2"}`, 400, "invalid_argument", `key "address" is given twice`},
		{"duplicate escaped key", "POST", InstancesPath, `{"namespace":"prod","component":"api","endpoint":"http","address":"h:1","addr\u0065ss":"h:2"}`, 400, "invalid_argument", `key "address" is given twice`},
		{"duplicate metadata key", "POST", InstancesPath, `{"namespace":"prod","component":"api","endpoint":"http","address":"h:1","metadata":{"zone":"a","zone":"b"}}`, 400, "invalid_argument", `key "metadata.zone" is given twice`},
		{"field in another case", "POST", InstancesPath, `{"namespace":"prod","component":"api","endpoint":"http","Address":"h:1"}`, 400, "invalid_argument", `unknown field "Address": field names are case-sensitive: did you mean "address"?`},
		{"update field in another case", "PATCH", InstancesPath + "/prod/api/http/00000000000000a1", `{"ADDRESS":"h:2"}`, 400, "invalid_argument", `did you mean "address"?`},
		{"update duplicate metadata", "PATCH", InstancesPath + "/prod/api/http/00000000000000a1", `{"metadata":{"k":"1","k":"2"}}`, 400, "invalid_argument", `key "metadata.k" is given twice`},
		{"heartbeat field in another case", "POST", InstancesPath + "/prod/api/http/00000000000000a1/heartbeat", `{"Lease":"1"}`, 400, "invalid_argument", `did you mean "lease"?`},
		{"malformed JSON", "POST", InstancesPath, `{"namespace":`, 400, "invalid_argument", "malformed JSON"},
		{"unknown field", "POST", InstancesPath, `{"namespace":"prod","component":"api","endpoint":"http","address":"h:1","adress":"x"}`, 400, "invalid_argument", "adress"}, //nolint:misspell // the unknown field
		{"two objects", "POST", InstancesPath, `{} {}`, 400, "invalid_argument", "more than one"},
		{"duplicate id", "POST", InstancesPath, `{"namespace":"prod","component":"api","endpoint":"http","id":"00000000000000a1","address":"h:2"}`, 409, "already_registered", "00000000000000a1"},
		{"bad filter", "GET", InstancesPath + "?component=api", "", 400, "invalid_argument", "namespace"},
		{"unknown filter", "GET", InstancesPath + "?nmespace=prod", "", 400, "invalid_argument", "nmespace"},
		{"bad status filter", "GET", InstancesPath + "?status=up", "", 400, "invalid_argument", "status"},
		{"heartbeat unknown id", "POST", InstancesPath + "/prod/api/http/00000000000000ff/heartbeat", ``, 404, "not_found", "00000000000000ff"},
		{"heartbeat bad id", "POST", InstancesPath + "/prod/api/http/xyz/heartbeat", ``, 400, "invalid_argument", "instance id"},
		{"heartbeat without secret", "POST", InstancesPath + "/prod/api/http/00000000000000a1/heartbeat", `{}`, 404, "not_found", "00000000000000a1"},
		{"heartbeat with a lease", "POST", InstancesPath + "/prod/api/http/00000000000000a1/heartbeat", `{"lease":"` + good.Lease + `"}`, 400, "invalid_argument", "Beacon-Secret"},
		{"heartbeat unknown field", "POST", InstancesPath + "/prod/api/http/00000000000000a1/heartbeat", `{"secret":"x"}`, 400, "invalid_argument", "secret"},
		{"deregister unknown", "DELETE", InstancesPath + "/prod/api/http/00000000000000ff", "", 404, "not_found", "00000000000000ff"},
		{"deregister with a lease", "DELETE", InstancesPath + "/prod/api/http/00000000000000a1?lease=" + good.Lease, "", 400, "invalid_argument", "Beacon-Secret"},
		{"update unknown", "PATCH", InstancesPath + "/prod/api/http/00000000000000ff", `{"address":"h:2"}`, 404, "not_found", "00000000000000ff"},
		{"update with a lease", "PATCH", InstancesPath + "/prod/api/http/00000000000000a1", `{"lease":"` + good.Lease + `","address":"h:2"}`, 400, "invalid_argument", "Beacon-Secret"},
		{"metadata not UTF-8", "POST", InstancesPath, "{\"namespace\":\"prod\",\"component\":\"api\",\"endpoint\":\"http\",\"address\":\"h:1\",\"metadata\":{\"k\":\"\xff\"}}", 400, "invalid_argument", "UTF-8"},
		{"metadata lone surrogate", "POST", InstancesPath, `{"namespace":"prod","component":"api","endpoint":"http","address":"h:1","metadata":{"k":"\ud800"}}`, 400, "invalid_argument", "surrogate"},
		{"get unknown", "GET", InstancesPath + "/prod/api/http/00000000000000ff", "", 404, "not_found", "00000000000000ff"},
		{"deregister no secret", "DELETE", InstancesPath + "/prod/api/http/00000000000000a1", "", 404, "not_found", "00000000000000a1"},
		{"body over 64 KiB", "POST", InstancesPath, `{"namespace":"prod","component":"api","endpoint":"http","address":"h:1","metadata":{"k":"` + strings.Repeat("v", 70<<10) + `"}}`, 413, "invalid_argument", "larger than"},
		{"update bad address", "PATCH", InstancesPath + "/prod/api/http/00000000000000a1", `{"address":"x"}`, 400, "invalid_argument", "address"},
		{"method", "PUT", InstancesPath, `{}`, 405, "method_not_allowed", "PUT"},
		{"watch bad since", "GET", WatchPath + "?since=yesterday", "", 400, "invalid_argument", "revision"},
		// null was taken as absent (a PATCH of "metadata":null changed
		// nothing, a metadata value null was ""); control characters in
		// metadata values and host names DNS cannot carry were accepted.
		{"update null metadata", "PATCH", InstancesPath + "/prod/api/http/00000000000000a1", `{"metadata":null}`, 400, "invalid_argument", `"metadata" is null`},
		{"null metadata value", "POST", InstancesPath, `{"namespace":"prod","component":"api","endpoint":"http","address":"h:1","metadata":{"k":null}}`, 400, "invalid_argument", `"metadata.k" is null`},
		{"null ttl", "POST", InstancesPath, `{"namespace":"prod","component":"api","endpoint":"http","address":"h:1","ttl":null}`, 400, "invalid_argument", `"ttl" is null`},
		{"newline in metadata value", "POST", InstancesPath, `{"namespace":"prod","component":"api","endpoint":"http","address":"h:1","metadata":{"k":"a\nb"}}`, 400, "invalid_argument", "control characters"},
		{"host label of 64", "POST", InstancesPath, `{"namespace":"prod","component":"api","endpoint":"http","address":"` + strings.Repeat("h", 64) + `:1"}`, 400, "invalid_argument", "host name label of 64 bytes"},
		{"gzip body", "POST", InstancesPath, "\x1f\x8b\x08\x00", 400, "invalid_argument", "gzip-compressed"},
		{"BOM", "POST", InstancesPath, "\xef\xbb\xbf{}", 400, "invalid_argument", "byte order mark"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			secret := ""
			if strings.HasPrefix(tt.name, "update bad") || strings.HasPrefix(tt.name, "update field") || strings.HasPrefix(tt.name, "update duplicate") ||
				strings.HasPrefix(tt.name, "update null") {
				secret = good.Secret
			}
			e := doSecret(t, tt.method, base+tt.path, tt.body, secret).wantError(t, tt.status, tt.code)
			if !strings.Contains(e.Message, tt.mention) {
				t.Fatalf("message %q does not mention %q", e.Message, tt.mention)
			}
		})
	}
	// Nothing was half-written: only the good registration exists.
	var list ListResponse
	do(t, "GET", base+InstancesPath, "").decode(t, &list)
	if len(list.Instances) != 1 || list.Instances[0].Address != "10.0.0.1:80" {
		t.Fatalf("after bad input: %+v", list)
	}
	if r := do(t, "POST", base+InstancesPath, ""); r.code != 400 {
		t.Fatalf("empty body: %d", r.code)
	}
	req, _ := http.NewRequest("POST", base+InstancesPath, strings.NewReader("namespace=x"))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnsupportedMediaType {
		t.Fatalf("form body: %d", resp.StatusCode)
	}
}

// sse reads Server-Sent Events from a watch stream.
type sse struct {
	resp *http.Response
	sc   *bufio.Scanner
}

type sseEvent struct{ event, id, data string }

func openWatch(t *testing.T, url string, lastID string) *sse {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		cancel()
		t.Fatalf("watch: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	t.Cleanup(func() { cancel(); resp.Body.Close() })
	return &sse{resp: resp, sc: bufio.NewScanner(resp.Body)}
}

// next returns the next event (skipping comments and the retry field),
// failing after the deadline.
func (s *sse) next(t *testing.T) sseEvent {
	t.Helper()
	type result struct {
		ev  sseEvent
		err error
	}
	ch := make(chan result, 1)
	go func() {
		var ev sseEvent
		for s.sc.Scan() {
			line := s.sc.Text()
			switch {
			case line == "":
				if ev.event != "" {
					ch <- result{ev: ev}
					return
				}
			case strings.HasPrefix(line, "event: "):
				ev.event = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "id: "):
				ev.id = strings.TrimPrefix(line, "id: ")
			case strings.HasPrefix(line, "data: "):
				ev.data = strings.TrimPrefix(line, "data: ")
			}
		}
		ch <- result{err: fmt.Errorf("stream ended: %v", s.sc.Err())}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatal(r.err)
		}
		return r.ev
	case <-time.After(10 * time.Second):
		t.Fatal("no event within 10s")
		return sseEvent{}
	}
}

func TestWatchStreamAndResume(t *testing.T) {
	srv, _ := newAPI(t)
	base := srv.URL
	first := register(t, base, `{"namespace":"prod","component":"api","endpoint":"http","address":"10.0.0.1:80"}`)

	w := openWatch(t, base+WatchPath+"?namespace=prod", "")
	snap := w.next(t)
	var sm SnapshotMessage
	if err := json.Unmarshal([]byte(snap.data), &sm); err != nil || snap.event != "snapshot" || len(sm.Instances) != 1 || snap.id != fmt.Sprint(sm.Revision) {
		t.Fatalf("snapshot: %+v (%v)", snap, err)
	}

	second := register(t, base, `{"namespace":"prod","component":"api","endpoint":"http","address":"10.0.0.2:80"}`)
	added := w.next(t)
	var em EventMessage
	if err := json.Unmarshal([]byte(added.data), &em); err != nil || added.event != "added" || em.Instance.ID != second.Instance.ID || added.id == "" {
		t.Fatalf("added: %+v (%v)", added, err)
	}
	// Another namespace is not in this stream.
	register(t, base, `{"namespace":"dev","component":"api","endpoint":"http","address":"10.0.0.3:80"}`)
	doSecret(t, "PATCH", instanceURL(base, first.Instance), `{"address":"10.0.0.9:80"}`, first.Secret)
	updated := w.next(t)
	if err := json.Unmarshal([]byte(updated.data), &em); err != nil || updated.event != "updated" || em.Instance.Address != "10.0.0.9:80" {
		t.Fatalf("updated: %+v (%v)", updated, err)
	}
	resumeFrom := updated.id

	// Changes while disconnected are delivered on resume, and nothing
	// from before.
	doSecret(t, "DELETE", instanceURL(base, second.Instance), "", second.Secret)
	w2 := openWatch(t, base+WatchPath+"?namespace=prod", resumeFrom)
	removed := w2.next(t)
	if removed.event == "synced" {
		// A removal of a serving instance reaches watchers 50 ms after it
		// happens (the registry tells a mass lease loss from a process
		// gone); a resume in between is in sync before it.
		removed = w2.next(t)
	}
	if err := json.Unmarshal([]byte(removed.data), &em); err != nil || removed.event != "removed" || em.Instance.ID != second.Instance.ID {
		t.Fatalf("resumed stream: %+v (%v)", removed, err)
	}
	// A resume with nothing new says it is in sync.
	// (A removal held back while a resumed stream was told it was in sync
	// at its revision is repeated to a resume from that revision:
	// removing an absent instance changes nothing.)
	w3 := openWatch(t, base+WatchPath+"?namespace=prod&since="+removed.id, "")
	ev := w3.next(t)
	repeat := ev.event == "removed" && ev.id == removed.id && ev.data == removed.data
	if (ev.event != "synced" || ev.id != removed.id) && !repeat {
		t.Fatalf("resume with nothing new: %+v", ev)
	}
	// A client asking for JSON gets 406 saying what the endpoint serves
	// (the stream was sent anyway); a browser's EventSource, curl's */*
	// and no Accept get the stream.
	for accept, status := range map[string]int{"application/json": 406, "text/event-stream": 200, "*/*": 200, "text/html, */*;q=0.8": 200} {
		ctx, cancel := context.WithCancel(context.Background())
		req, err := http.NewRequestWithContext(ctx, "GET", base+WatchPath, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Accept", accept)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body []byte
		if resp.StatusCode != 200 {
			body, _ = io.ReadAll(resp.Body)
		}
		cancel()
		resp.Body.Close()
		if resp.StatusCode != status || (status == 406 && (!strings.Contains(string(body), `"code":"not_acceptable"`) ||
			!strings.Contains(string(body), "send Accept: text/event-stream"))) {
			t.Fatalf("watch with Accept: %s: %d %s, want %d", accept, resp.StatusCode, body, status)
		}
	}
	// A revision the store never gave is refused, saying so (it was taken
	// silently as a fresh watch).
	if e := do(t, "GET", base+WatchPath+"?namespace=prod&since=99999999", "").wantError(t, 400, "invalid_argument"); !strings.Contains(e.Message, "the store is only at revision") {
		t.Fatalf("resume from a revision never given: %+v", e)
	}
}

// TestRegistryClosedIsUnavailable: once the registry behind the API is
// closed (the server is stopping), requests get 503 with a JSON body and
// open watch streams end with an error event.
func TestRegistryClosedIsUnavailable(t *testing.T) {
	srv, reg := newAPI(t)
	base := srv.URL
	w := openWatch(t, base+WatchPath, "")
	if ev := w.next(t); ev.event != "snapshot" {
		t.Fatalf("first event %+v", ev)
	}
	if err := reg.Close(); err != nil {
		t.Fatal(err)
	}
	if ev := w.next(t); ev.event != "error" || !strings.Contains(ev.data, `"code":"unavailable"`) {
		t.Fatalf("watch after close: %+v", ev)
	}
	do(t, "GET", base+InstancesPath, "").wantError(t, 503, "unavailable")
	do(t, "POST", base+InstancesPath, `{"namespace":"prod","component":"api","endpoint":"http","address":"h:1"}`).wantError(t, 503, "unavailable")
	do(t, "GET", base+WatchPath, "").wantError(t, 503, "unavailable")
}

func TestLeaseExpiryRemovesHTTPRegistration(t *testing.T) {
	srv, _ := newAPI(t)
	base := srv.URL
	w := openWatch(t, base+WatchPath, "")
	if ev := w.next(t); ev.event != "snapshot" {
		t.Fatalf("first event %+v", ev)
	}
	reg := register(t, base, `{"namespace":"prod","component":"api","endpoint":"http","address":"10.0.0.1:80","ttl":1}`)
	if ev := w.next(t); ev.event != "added" {
		t.Fatalf("want added, got %+v", ev)
	}
	// No heartbeat: the instance goes when its lease expires.
	start := time.Now()
	ev := w.next(t)
	if ev.event != "removed" || !strings.Contains(ev.data, reg.Instance.ID) {
		t.Fatalf("want removed, got %+v", ev)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("removal took %v for a 1 s TTL", took)
	}
}

func TestTTLJSON(t *testing.T) {
	for in, want := range map[string]time.Duration{`"15s"`: 15 * time.Second, `15`: 15 * time.Second, `"1m"`: time.Minute, `1.5`: 1500 * time.Millisecond} {
		var ttl TTL
		if err := json.Unmarshal([]byte(in), &ttl); err != nil || time.Duration(ttl) != want {
			t.Errorf("TTL %s = %v, %v", in, time.Duration(ttl), err)
		}
	}
	for _, in := range []string{`"0s"`, `0`, `-1`, `"2h"`, `true`, `"x"`, `1e308`, `-1e308`, `1e400`, `"9999999999h"`, `"99999999999999999999"`} {
		var ttl TTL
		if err := json.Unmarshal([]byte(in), &ttl); err == nil {
			t.Errorf("TTL %s accepted as %v", in, time.Duration(ttl))
		}
	}
}

func FuzzRegisterBody(f *testing.F) {
	f.Add([]byte(`{"namespace":"prod","component":"api","endpoint":"http","address":"10.0.0.1:80","ttl":"10s"}`))
	f.Add([]byte(`{"namespace":"prod","ttl":1e309}`))
	f.Add([]byte(`{"metadata":{"a":"b"},"ttl":-5}`))
	st := memory.New(memory.Config{})
	reg, err := registry.New(st, registry.Config{})
	if err != nil {
		f.Fatal(err)
	}
	defer st.Close()
	defer reg.Close()
	h, err := New(reg, Config{})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req := httptest.NewRequest("POST", InstancesPath, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		switch rec.Code {
		case 201, 400, 409, 413:
		default:
			t.Fatalf("status %d for %q: %s", rec.Code, body, rec.Body)
		}
		if rec.Code != 201 {
			var e ErrorResponse
			if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Code == "" {
				t.Fatalf("error body %q for %q", rec.Body, body)
			}
		}
	})
}

// readOnlyRegistry exposes only the Registry interface of a real registry,
// hiding its optional capabilities (leases, Get), as a registry without
// leases would.
type readOnlyRegistry struct{ registry.Registry }

// TestRegistryWithoutLeases serves a registry that cannot register over
// HTTP: reads work (Get falls back to List), writes are 501.
func TestRegistryWithoutLeases(t *testing.T) {
	st := memory.New(memory.Config{})
	reg, err := registry.New(st, registry.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reg.Close(); _ = st.Close() })
	h, err := New(readOnlyRegistry{reg}, Config{})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)

	ctx := context.Background()
	r, err := reg.Register(ctx, beacon.Instance{Namespace: "ns", Component: "c", Endpoint: "e", Address: "127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	in := r.Instance()
	var got beacon.Instance
	do(t, "GET", instanceURL(srv.URL, in), "").decode(t, &got)
	if got.ID != in.ID || got.Address != in.Address {
		t.Fatalf("GET = %+v, want %+v", got, in)
	}
	missing := in
	missing.ID = "00000000000000aa"
	do(t, "GET", instanceURL(srv.URL, missing), "").wantError(t, http.StatusNotFound, "not_found")

	body := `{"namespace":"ns","component":"c","endpoint":"e","address":"127.0.0.1:2"}`
	do(t, "POST", srv.URL+InstancesPath, body).wantError(t, http.StatusNotImplemented, "not_implemented")
	doSecret(t, "POST", instanceURL(srv.URL, in)+"/heartbeat", ``, "s").wantError(t, http.StatusNotImplemented, "not_implemented")
	doSecret(t, "POST", instanceURL(srv.URL, in)+"/report", ``, "s").wantError(t, http.StatusNotImplemented, "not_implemented")
	doSecret(t, "PATCH", instanceURL(srv.URL, in), `{"address":"h:1"}`, "s").wantError(t, http.StatusNotImplemented, "not_implemented")
	doSecret(t, "DELETE", instanceURL(srv.URL, in), "", "s").wantError(t, http.StatusNotImplemented, "not_implemented")
	do(t, "POST", instanceURL(srv.URL, in)+"/drain", "").wantError(t, http.StatusNotImplemented, "not_implemented")
	do(t, "POST", instanceURL(srv.URL, in)+"/deregister", "").wantError(t, http.StatusNotImplemented, "not_implemented")
	var list ListResponse
	do(t, "GET", srv.URL+InstancesPath+"?namespace=ns", "").decode(t, &list)
	if len(list.Instances) != 1 {
		t.Fatalf("list = %+v, want the one instance registered with the library", list)
	}
}

// TestRegisterAnswerNotStored: the answer that carries a registration's
// secret tells caches not to keep it (it said nothing).
func TestRegisterAnswerNotStored(t *testing.T) {
	srv, _ := newAPI(t)
	resp, err := http.Post(srv.URL+InstancesPath, "application/json",
		strings.NewReader(`{"namespace":"prod","component":"api","endpoint":"http","address":"10.0.0.1:80","ttl":"30s"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || resp.Header.Get("Cache-Control") != "no-store" {
		t.Fatalf("register: %d, Cache-Control %q; want 201 and no-store", resp.StatusCode, resp.Header.Get("Cache-Control"))
	}
}

// TestRegisterWarnsBelowElectionTTL: a registration whose TTL is below
// registry.MinElectionTTL is answered with a warning that says so; one at
// it is not.
func TestRegisterWarnsBelowElectionTTL(t *testing.T) {
	srv, _ := newAPI(t)
	short := register(t, srv.URL, `{"namespace":"prod","component":"api","endpoint":"http","address":"10.0.0.1:80","ttl":"3s"}`)
	if !strings.Contains(short.Warning, "below 5s, the shortest that rides out an etcd leader election") {
		t.Fatalf("TTL 3s answered with warning %q", short.Warning)
	}
	long := register(t, srv.URL, `{"namespace":"prod","component":"api","endpoint":"http","address":"10.0.0.2:80","ttl":"5s"}`)
	if long.Warning != "" {
		t.Fatalf("TTL 5s answered with warning %q", long.Warning)
	}
}

// TestRegisterWarnsOfRoutingMetadataNoOneReads: metadata weight,
// priority or lb_policy that DNS and xDS cannot read is registered (it is
// free-form) with a warning that says how the instance is routed instead;
// before, DNS used its defaults without a word. With a short TTL both
// warnings come.
func TestRegisterWarnsOfRoutingMetadataNoOneReads(t *testing.T) {
	srv, _ := newAPI(t)
	got := register(t, srv.URL, `{"namespace":"prod","component":"api","endpoint":"http","address":"10.0.0.1:80","ttl":"3s",`+
		`"metadata":{"weight":"70000","priority":"-1","lb_policy":"random"}}`)
	for _, want := range []string{"below 5s", `weight="70000" is not 0-65535`, `priority="-1" is not 0-65535`, `lb_policy="random" is none of`} {
		if !strings.Contains(got.Warning, want) {
			t.Errorf("warning %q lacks %q", got.Warning, want)
		}
	}
	fine := register(t, srv.URL, `{"namespace":"prod","component":"api","endpoint":"http","address":"10.0.0.2:80","ttl":"5s",`+
		`"metadata":{"weight":"0","priority":"65535","lb_policy":"ring_hash"}}`)
	if fine.Warning != "" {
		t.Fatalf("readable routing metadata answered with warning %q", fine.Warning)
	}
}
