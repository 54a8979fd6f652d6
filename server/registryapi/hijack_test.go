package registryapi

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry"
)

// TestHijackAttempts attacks a registration over HTTP as the issue's
// prober did, and more: lease IDs in every place a credential could go,
// guessed and truncated secrets, another registration's secret, a secret
// replayed after the ID was registered again, and a Go session's instance.
// Every attempt is answered byte for byte like a request for an instance
// that does not exist, and nothing changes.
func TestHijackAttempts(t *testing.T) {
	srv, reg := newAPI(t)
	base := srv.URL
	victim := register(t, base, `{"namespace":"prod","component":"api","endpoint":"http","address":"10.0.0.1:80","ttl":"1m"}`)
	other := register(t, base, `{"namespace":"prod","component":"api","endpoint":"http","address":"10.0.0.2:80","ttl":"1m"}`)
	sess, err := reg.Register(context.Background(), beacon.Instance{Namespace: "prod", Component: "api", Endpoint: "http", Address: "10.0.0.3:80"})
	if err != nil {
		t.Fatal(err)
	}
	sessionLease := strconv.FormatUint(uint64(reg.Lease()), 16)
	missing := beacon.Ref{Namespace: "prod", Component: "api", Endpoint: "http", ID: "00000000000000ff"}

	type attempt struct{ method, suffix, body string }
	verbs := []attempt{
		{"POST", "/heartbeat", ""},
		{"PATCH", "", `{"address":"10.6.6.6:80"}`},
		{"DELETE", "", ""},
	}
	// The answer for a missing instance, per verb.
	want := map[string]reply{}
	for _, v := range verbs {
		want[v.method] = doSecret(t, v.method, base+InstancesPath+"/"+missing.String()+v.suffix, v.body, victim.Secret)
		if want[v.method].code != http.StatusNotFound {
			t.Fatalf("%s of a missing instance: %d %s", v.method, want[v.method].code, want[v.method].body)
		}
	}
	leases := []string{victim.Lease, sessionLease, "0x" + victim.Lease}
	if n, err := strconv.ParseUint(victim.Lease, 16, 64); err == nil {
		leases = append(leases, strconv.FormatUint(n, 10), strconv.FormatUint(n+1, 16), strconv.FormatUint(n-1, 16))
	}
	var secrets []string
	secrets = append(secrets, leases...)
	secrets = append(secrets, "", other.Secret, victim.Secret[1:], victim.Secret+"x", strings.ToUpper(victim.Secret),
		string(registry.NewSecret()), string(registry.NewSecret()), " "+other.Secret)

	for _, target := range []beacon.Ref{victim.Instance.Ref(), sess.Instance().Ref()} {
		for _, v := range verbs {
			for _, s := range secrets {
				got := doSecret(t, v.method, base+InstancesPath+"/"+target.String()+v.suffix, v.body, s)
				wantBody := strings.ReplaceAll(string(want[v.method].body), missing.String(), target.String())
				if got.code != http.StatusNotFound || string(got.body) != wantBody {
					t.Fatalf("%s %s with secret %q: %d %s; want the missing-instance answer %s", v.method, target, s, got.code, got.body, wantBody)
				}
			}
		}
	}
	// The old credential places are refused outright, before any lookup.
	for _, l := range leases {
		doSecret(t, "DELETE", instanceURL(base, victim.Instance)+"?lease="+l, "", "").wantError(t, 400, "invalid_argument")
		doSecret(t, "POST", instanceURL(base, victim.Instance)+"/heartbeat", `{"lease":"`+l+`"}`, "").wantError(t, 400, "invalid_argument")
	}
	// Nothing changed.
	var list ListResponse
	do(t, "GET", base+InstancesPath+"?namespace=prod", "").decode(t, &list)
	if len(list.Instances) != 3 {
		t.Fatalf("after the attempts: %+v", list.Instances)
	}
	for _, in := range list.Instances {
		if in.Address == "10.6.6.6:80" {
			t.Fatalf("an attempt changed %s", in.Ref())
		}
	}
	if reg.State() != registry.StateActive || strconv.FormatUint(uint64(reg.Lease()), 16) != sessionLease {
		t.Fatalf("the session lost its lease: %v %x", reg.State(), reg.Lease())
	}

	// A duplicate ID is refused without revealing anyone's lease.
	dup := do(t, "POST", base+InstancesPath, `{"namespace":"prod","component":"api","endpoint":"http","id":"`+victim.Instance.ID+`","address":"10.0.0.4:80"}`)
	dup.wantError(t, http.StatusConflict, "already_registered")
	if strings.Contains(string(dup.body), "lease") {
		t.Fatalf("409 reveals a lease: %s", dup.body)
	}

	// Replay: the secret of an ended registration does not fit a new
	// registration of the same ID.
	doSecret(t, "DELETE", instanceURL(base, victim.Instance), "", victim.Secret)
	again := register(t, base, `{"namespace":"prod","component":"api","endpoint":"http","id":"`+victim.Instance.ID+`","address":"10.0.0.9:80","ttl":"1m"}`)
	doSecret(t, "POST", instanceURL(base, again.Instance)+"/heartbeat", "", victim.Secret).wantError(t, 404, "not_found")
	if r := doSecret(t, "POST", instanceURL(base, again.Instance)+"/heartbeat", "", again.Secret); r.code != 200 {
		t.Fatalf("owner's heartbeat: %d %s", r.code, r.body)
	}
}

// TestLimits: watch streams and registrations per client and in all are
// capped with 429 and Retry-After; what ends frees its place.
func TestLimits(t *testing.T) {
	reg := newRegistryForTest(t)
	clientOf := func(r *http.Request) string { return r.Header.Get("X-Test-Client") }
	h, err := New(reg, Config{KeepAliveInterval: 200 * time.Millisecond, Limits: Limits{
		MaxWatchesPerClient: 2, MaxWatches: 3, MaxRegistrationsPerClient: 2, MaxRegistrations: 3, Client: clientOf,
	}})
	if err != nil {
		t.Fatal(err)
	}
	srv := newServer(t, h)
	as := func(client, method, path, body, secret string) reply {
		t.Helper()
		return doHeaders(t, method, srv.URL+path, body, map[string]string{"X-Test-Client": client, SecretHeader: secret})
	}
	body := `{"namespace":"prod","component":"api","endpoint":"http","address":"10.0.0.1:80","ttl":"1m"}`
	var first RegisterResponse
	as("a", "POST", InstancesPath, body, "").decode(t, &first)
	as("a", "POST", InstancesPath, body, "")
	r := as("a", "POST", InstancesPath, body, "")
	e := r.wantError(t, http.StatusTooManyRequests, "resource_exhausted")
	if !strings.Contains(e.Message, "client a") {
		t.Fatalf("429 message %q does not name the client", e.Message)
	}
	as("b", "POST", InstancesPath, body, "")
	as("c", "POST", InstancesPath, body, "").wantError(t, http.StatusTooManyRequests, "resource_exhausted") // total
	// Deregistering frees a place.
	if r := as("a", "DELETE", InstancesPath+"/"+first.Instance.Ref().String(), "", first.Secret); r.code != http.StatusNoContent {
		t.Fatalf("deregister: %d %s", r.code, r.body)
	}
	if r := as("c", "POST", InstancesPath, body, ""); r.code != http.StatusCreated {
		t.Fatalf("after a deregistration: %d %s", r.code, r.body)
	}

	w1 := openWatchAs(t, srv.URL+WatchPath, "a")
	openWatchAs(t, srv.URL+WatchPath, "a")
	resp := getAs(t, srv.URL+WatchPath, "a")
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("third watch of one client: %d Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	openWatchAs(t, srv.URL+WatchPath, "b")
	if resp := getAs(t, srv.URL+WatchPath, "c"); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("watch over the total: %d", resp.StatusCode)
	}
	w1.close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp := getAs(t, srv.URL+WatchPath, "c")
		if resp.StatusCode == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a closed stream did not free its place: %d", resp.StatusCode)
		}
		waitABit(t)
	}
}

// TestTokenCreationLimits: token creations are a rate per client and in
// all (a bucket of N refilled at N per minute), refused with 429 and a
// Retry-After of when the next one is allowed; -1 lifts a cap.
func TestTokenCreationLimits(t *testing.T) {
	q, err := newQuota(Limits{MaxTokenCreationsPerClient: 2, MaxTokenCreations: 3})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	q.now = func() time.Time { return now }
	allow := func(client string) *httptest.ResponseRecorder {
		t.Helper()
		w := httptest.NewRecorder()
		if q.allowCreate(w, client) {
			w.Code = 0
		}
		return w
	}
	for _, c := range []string{"a", "a"} {
		if w := allow(c); w.Code != 0 {
			t.Fatalf("creation of %s within the cap: %d %s", c, w.Code, w.Body)
		}
	}
	w := allow("a")
	if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != "30" || !strings.Contains(w.Body.String(), "client a") {
		t.Fatalf("third creation of a in a minute: %d Retry-After %q %s", w.Code, w.Header().Get("Retry-After"), w.Body)
	}
	if w := allow("b"); w.Code != 0 {
		t.Fatalf("b: %d %s", w.Code, w.Body)
	}
	if w := allow("c"); w.Code != http.StatusTooManyRequests || !strings.Contains(w.Body.String(), "this server") {
		t.Fatalf("over the total: %d %s", w.Code, w.Body)
	}
	now = now.Add(30 * time.Second) // one more for a, 1.5 more in all
	if w := allow("a"); w.Code != 0 {
		t.Fatalf("a after 30 s: %d %s", w.Code, w.Body)
	}
	if w := allow("a"); w.Code != http.StatusTooManyRequests {
		t.Fatalf("a again at once: %d", w.Code)
	}

	unlimited, err := newQuota(Limits{MaxTokenCreationsPerClient: -1, MaxTokenCreations: -1})
	if err != nil {
		t.Fatal(err)
	}
	for range 10_000 {
		if !unlimited.allowCreate(httptest.NewRecorder(), "a") {
			t.Fatal("refused without limits")
		}
	}
}
