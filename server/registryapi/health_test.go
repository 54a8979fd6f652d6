package registryapi

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/testkit/healthtest"
	"github.com/beaconplane/beacon/registry"
)

// TestRegisterWithCheck: a registration declares its check in beacon.Check's
// JSON (durations as strings); the instance carries it back, as stored.
func TestRegisterWithCheck(t *testing.T) {
	srv, _ := newAPI(t)
	reg := register(t, srv.URL, `{"namespace":"prod","component":"api","endpoint":"http","address":"10.0.0.1:80",`+
		`"check":{"kind":"http","path":"/healthz","interval":"5s","timeout":"1500ms","rise":1,"fall":4}}`)
	want := beacon.Check{Kind: beacon.CheckHTTP, Path: "/healthz", Interval: 5 * time.Second, Timeout: 1500 * time.Millisecond, Rise: 1, Fall: 4}
	if reg.Instance.Check == nil || *reg.Instance.Check != want {
		t.Fatalf("registered check %+v, want %+v", reg.Instance.Check, want)
	}
	got := do(t, "GET", instanceURL(srv.URL, reg.Instance), "")
	if !strings.Contains(string(got.body), `"check":{"kind":"http","path":"/healthz","interval":"5s","timeout":"1.5s","rise":1,"fall":4}`) {
		t.Fatalf("GET: %s", got.body)
	}
	ttl := register(t, srv.URL, `{"namespace":"prod","component":"api","endpoint":"http","address":"10.0.0.2:80","check":{"kind":"ttl","ttl":"30s"}}`)
	if c := ttl.Instance.Check; c == nil || c.Kind != beacon.CheckTTL || c.TTL != 30*time.Second {
		t.Fatalf("registered TTL check %+v", c)
	}
}

// TestRegisterBadCheck: a check that is not valid is refused with 400,
// naming the check and the field, and saying what to write; nothing is
// registered.
func TestRegisterBadCheck(t *testing.T) {
	srv, reg := newAPI(t)
	const prefix = `{"namespace":"prod","component":"api","endpoint":"http","address":"10.0.0.1:80","check":`
	for _, tc := range []struct{ name, check, mention string }{
		{"unknown kind", `{"kind":"icmp"}`, "the kind must be grpc, http, tcp or ttl"},
		{"no kind", `{"path":"/healthz"}`, "the kind must be grpc, http, tcp or ttl"},
		{"path without slash", `{"kind":"http","path":"healthz"}`, "the HTTP path must start with /"},
		{"interval not a duration", `{"kind":"tcp","interval":"10"}`, `interval "10" is not a duration such as "10s"`},
		{"interval a number", `{"kind":"tcp","interval":10}`, `"check.interval" is a number: give a duration string such as "10s"`},
		{"rise a string", `{"kind":"tcp","rise":"2"}`, `"check.rise" is a string: give a whole number`},
		{"path a number", `{"kind":"http","path":1}`, `"check.path" is a number: give a string`},
		{"interval too short", `{"kind":"tcp","interval":"100ms"}`, "interval 100ms is outside 500ms..10m0s"},
		{"timeout above interval", `{"kind":"tcp","interval":"1s","timeout":"2s"}`, "timeout 2s must be at least 50ms and at most the interval (1s)"},
		{"rise too high", `{"kind":"tcp","rise":101}`, "rise 101 must be 1..100"},
		{"fall negative", `{"kind":"tcp","fall":-1}`, "fall -1 must be 1..100"},
		{"ttl missing", `{"kind":"ttl"}`, "the TTL must be 1s..24h0m0s"},
		{"misspelt field", `{"kind":"tcp","intervall":"5s"}`, `unknown field "intervall" in "check": a check has fall, interval, kind, path, rise, service, timeout, ttl`},
		{"not an object", `"tcp"`, `"check" must be an object such as {"kind":"http"`},
		{"null", `null`, `"check" is null`},
		{"null field", `{"kind":"tcp","interval":null}`, `"check.interval" is null`},
		{"duplicate field", `{"kind":"tcp","kind":"http"}`, `key "check.kind" is given twice`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := do(t, "POST", srv.URL+InstancesPath, prefix+tc.check+`}`).wantError(t, http.StatusBadRequest, "invalid_argument")
			t.Log(e.Message)
			if !strings.Contains(e.Message, tc.mention) || !strings.Contains(e.Message, "check") || strings.HasPrefix(e.Message, "malformed") {
				t.Errorf("message %q, want one naming the check and saying %q (and not calling the JSON malformed)", e.Message, tc.mention)
			}
		})
	}
	ins, _, err := reg.List(context.Background(), beacon.Query{})
	if err != nil || len(ins) != 0 {
		t.Fatalf("after refused registrations the registry holds %v (%v)", ins, err)
	}
}

// TestInvalidCheckIsBadRequest: a registry that refuses a check (a backend
// that runs none, say) is answered 400, not 500.
func TestInvalidCheckIsBadRequest(t *testing.T) {
	h, err := New(newRegistryForTest(t), Config{})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	h.fail(rec, httptest.NewRequest("POST", InstancesPath, nil), fmt.Errorf("registry: %w: this backend runs no checks", beacon.ErrInvalidCheck))
	reply{rec.Code, rec.Body.Bytes(), rec.Header()}.wantError(t, http.StatusBadRequest, "invalid_argument")
}

// checkedAPI serves the API over a registry whose instances the test
// writes with the verdicts it chooses (healthtest.Put).
func checkedAPI(t *testing.T) (*httptest.Server, func(ins ...beacon.Instance)) {
	t.Helper()
	reg := healthtest.NewRegistry(t)
	return serveAPI(t, reg.StoreRegistry), func(ins ...beacon.Instance) { t.Helper(); reg.Put(t, ins...) }
}

func checkedInstance(id, addr string) beacon.Instance {
	return beacon.Instance{Namespace: "prod", Component: "api", Endpoint: "http", ID: id, Address: addr,
		Status: beacon.StatusServing, RegisteredAt: time.Unix(1_700_000_000, 0).UTC()}
}

// TestHealthInListGetWatch: list, get and the watch stream carry each
// instance's "health" (absent for an instance without a check), and a
// change of verdict alone reaches watchers as an update.
func TestHealthInListGetWatch(t *testing.T) {
	srv, put := checkedAPI(t)
	a, b, c := checkedInstance("00000000000000a1", "10.0.0.1:80"), checkedInstance("00000000000000a2", "10.0.0.2:80"),
		checkedInstance("00000000000000a3", "10.0.0.3:80")
	put(healthtest.Passing(a), healthtest.Failing(b, "connection refused"), c)

	var list ListResponse
	do(t, "GET", srv.URL+InstancesPath+"?namespace=prod", "").decode(t, &list)
	got := map[string]string{}
	for _, in := range list.Instances {
		got[in.ID] = healthOf(in)
	}
	want := map[string]string{a.ID: "passing", b.ID: "failing: connection refused", c.ID: "-"}
	for id, w := range want {
		if got[id] != w {
			t.Errorf("list: %s health %q, want %q", id, got[id], w)
		}
	}
	one := do(t, "GET", instanceURL(srv.URL, b), "")
	if !strings.Contains(string(one.body), `"health":{"status":"failing","reason":"connection refused","since":"2025-01-02T03:04:05Z","checker":"healthtest"}`) {
		t.Errorf("GET of a failing instance: %s", one.body)
	}
	if plain := do(t, "GET", instanceURL(srv.URL, c), ""); strings.Contains(string(plain.body), `"health"`) || strings.Contains(string(plain.body), `"check"`) {
		t.Errorf("GET of an instance without a check: %s", plain.body)
	}

	w := openWatch(t, srv.URL+WatchPath+"?namespace=prod", "")
	var sm SnapshotMessage
	if snap := w.next(t); json.Unmarshal([]byte(snap.data), &sm) != nil || snap.event != "snapshot" || len(sm.Instances) != 3 {
		t.Fatalf("snapshot: %+v", snap)
	}
	put(healthtest.Passing(b))
	for {
		ev := w.next(t)
		var em EventMessage
		if err := json.Unmarshal([]byte(ev.data), &em); err != nil {
			t.Fatalf("event %+v: %v", ev, err)
		}
		if ev.event == "updated" && em.Instance.ID == b.ID && healthOf(em.Instance) == "passing" {
			break
		}
	}
	put(healthtest.Panic(a, "timeout"), healthtest.Panic(b, "timeout"))
	for {
		ev := w.next(t)
		if ev.event == "updated" && strings.Contains(ev.data, `"id":"`+b.ID+`"`) && strings.Contains(ev.data, `"panic":true`) {
			break
		}
	}
}

func healthOf(in beacon.Instance) string {
	switch h := in.Health; {
	case h == nil:
		return "-"
	case h.Reason != "":
		return string(h.Status) + ": " + h.Reason
	default:
		return string(h.Status)
	}
}

// TestReport: the owner of a registration with a TTL check reports that
// it is fine (POST .../report with its secret), and the report is stored
// beside the instance, where the instance's checker reads it; a wrong
// secret is an unknown instance.
func TestReport(t *testing.T) {
	reg := healthtest.NewRegistry(t)
	srv := serveAPI(t, reg.StoreRegistry)
	r := register(t, srv.URL, `{"namespace":"prod","component":"api","endpoint":"http","address":"10.0.0.1:80","check":{"kind":"ttl","ttl":"30s"}}`)
	url := instanceURL(srv.URL, r.Instance) + "/report"
	before := time.Now()
	if rep := doSecret(t, "POST", url, "", r.Secret); rep.code != http.StatusNoContent {
		t.Fatalf("report: %d %s", rep.code, rep.body)
	}
	kv, err := reg.Store.Get(context.Background(), reg.Keyspace().Key(r.Instance.Ref())+"/report")
	if err != nil {
		t.Fatalf("the report is not stored beside the instance: %v", err)
	}
	var stored struct {
		At time.Time `json:"at"`
	}
	if err := json.Unmarshal(kv.Value, &stored); err != nil || stored.At.Before(before.Truncate(time.Second)) {
		t.Errorf("stored report %s (%v), want {\"at\": a time after %v}", kv.Value, err, before)
	}
	if kv.Lease == 0 {
		t.Error("the report is bound to no lease: it would outlive the instance")
	}
	doSecret(t, "POST", url, `{}`, r.Secret+"x").wantError(t, http.StatusNotFound, "not_found")
	do(t, "POST", url, "").wantError(t, http.StatusNotFound, "not_found")
	doSecret(t, "POST", url, `{"lease":"`+r.Lease+`"}`, r.Secret).wantError(t, http.StatusBadRequest, "invalid_argument")
}

// leasedOnly is a registry that registers over HTTP but takes no TTL
// check reports.
type leasedOnly struct {
	registry.Registry
	registry.LeasedRegistrar
}

// TestReportWithoutReporter: a registry that takes no reports answers the
// report route 501, saying what to declare instead.
func TestReportWithoutReporter(t *testing.T) {
	reg := newRegistryForTest(t)
	h, err := New(leasedOnly{reg, reg}, Config{})
	if err != nil {
		t.Fatal(err)
	}
	srv := newServer(t, h)
	r := register(t, srv.URL, `{"namespace":"prod","component":"api","endpoint":"http","address":"10.0.0.1:80"}`)
	e := doSecret(t, "POST", instanceURL(srv.URL, r.Instance)+"/report", "", r.Secret).wantError(t, http.StatusNotImplemented, "not_implemented")
	if !strings.Contains(e.Message, "declare a grpc, http or tcp check instead") {
		t.Errorf("message %q", e.Message)
	}
}
