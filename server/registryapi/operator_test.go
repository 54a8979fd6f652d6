package registryapi

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry"
)

// operatorHeader marks the test's requests that act as an operator, as an
// authenticated etcd user would (the server's Operators hook).
const operatorHeader = "X-Test-Operator"

// newOperatorAPI serves the API with an Operators hook that lets requests
// carrying operatorHeader act through the registry.
func newOperatorAPI(t *testing.T) (*httptest.Server, *registry.StoreRegistry) {
	t.Helper()
	reg := newRegistryForTest(t)
	h, err := New(reg, Config{Operators: func(r *http.Request) (registry.Discoverer, string) {
		if who := r.Header.Get(operatorHeader); who != "" {
			return reg, who
		}
		return nil, ""
	}})
	if err != nil {
		t.Fatal(err)
	}
	return newServer(t, h), reg
}

func asOperator(t *testing.T, method, url, body string) reply {
	t.Helper()
	return doHeaders(t, method, url, body, map[string]string{operatorHeader: "ops"})
}

// TestOperatorActions drains and deregisters instances as an operator: an
// HTTP registration (whose owner's heartbeats survive the drain and whose
// next heartbeat after the deregistration finds nothing) and a Go
// session's instance; bad requests are refused before anything is looked
// up.
func TestOperatorActions(t *testing.T) {
	srv, reg := newOperatorAPI(t)
	base := srv.URL
	owned := register(t, base, `{"namespace":"prod","component":"api","endpoint":"http","address":"10.0.0.1:80","ttl":"1m"}`)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sess, err := reg.Register(ctx, beacon.Instance{Namespace: "prod", Component: "api", Endpoint: "http", Address: "10.0.0.3:80"})
	if err != nil {
		t.Fatal(err)
	}
	one := instanceURL(base, owned.Instance)

	var got beacon.Instance
	asOperator(t, "POST", one+"/drain", "").decode(t, &got)
	if got.Status != beacon.StatusDraining || got.Address != "10.0.0.1:80" || got.ID != owned.Instance.ID {
		t.Fatalf("drain answered %+v", got)
	}
	asOperator(t, "POST", one+"/drain", `{}`).decode(t, &got) // again: unchanged
	if got.Status != beacon.StatusDraining {
		t.Fatalf("second drain answered %+v", got)
	}
	if r := doSecret(t, "POST", one+"/heartbeat", "", owned.Secret); r.code != http.StatusOK {
		t.Fatalf("the owner's heartbeat after the drain: %d %s", r.code, r.body)
	}
	// The owner's PATCH without a status keeps the drain; with one, it
	// serves again.
	doSecret(t, "PATCH", one, `{"metadata":{"k":"v"}}`, owned.Secret).decode(t, &got)
	if got.Status != beacon.StatusDraining {
		t.Fatalf("the owner's PATCH without a status: %+v", got)
	}
	doSecret(t, "PATCH", one, `{"status":"serving"}`, owned.Secret).decode(t, &got)
	if got.Status != beacon.StatusServing {
		t.Fatalf("the owner's PATCH to serving: %+v", got)
	}

	// A Go session's instance: drained in the store, and the session
	// shows it.
	asOperator(t, "POST", instanceURL(base, sess.Instance())+"/drain", "").decode(t, &got)
	if got.Status != beacon.StatusDraining {
		t.Fatalf("drain of a session's instance answered %+v", got)
	}

	// Refused before any lookup: the same answer for a real and a missing
	// instance.
	missing := beacon.Ref{Namespace: "prod", Component: "api", Endpoint: "http", ID: "00000000000000ff"}
	for _, path := range []string{one, base + InstancesPath + "/" + missing.String()} {
		for _, action := range []string{"/drain", "/deregister"} {
			e := doHeaders(t, "POST", path+action, "", map[string]string{operatorHeader: "ops", SecretHeader: owned.Secret}).wantError(t, 400, "invalid_argument")
			if !strings.Contains(e.Message, SecretHeader) {
				t.Errorf("a secret sent to %s: %q", action, e.Message)
			}
			asOperator(t, "POST", path+action+"?force=1", "").wantError(t, 400, "invalid_argument")
			asOperator(t, "POST", path+action, `{"force":true}`).wantError(t, 400, "invalid_argument")
			asOperator(t, "GET", path+action, "").wantError(t, 405, "method_not_allowed")
		}
	}
	asOperator(t, "POST", base+InstancesPath+"/prod/api/http/nothex/drain", "").wantError(t, 400, "invalid_argument")
	asOperator(t, "POST", base+InstancesPath+"/"+missing.String()+"/drain", "").wantError(t, 404, "not_found")
	asOperator(t, "POST", base+InstancesPath+"/"+missing.String()+"/deregister", "").wantError(t, 404, "not_found")

	// Deregistering the HTTP registration removes it; its owner's next
	// heartbeat gets 404.
	if r := asOperator(t, "POST", one+"/deregister", ""); r.code != http.StatusNoContent {
		t.Fatalf("deregister: %d %s", r.code, r.body)
	}
	do(t, "GET", one, "").wantError(t, 404, "not_found")
	doSecret(t, "POST", one+"/heartbeat", "", owned.Secret).wantError(t, 404, "not_found")
	asOperator(t, "POST", one+"/deregister", "").wantError(t, 404, "not_found")
}

// TestOperatorActionsNeedAnOperator: without an authenticated operator
// (no Operators hook, or a request it does not recognise), drain and
// deregister are 403 with a message that says what is needed, the same
// for every instance, and nothing changes.
func TestOperatorActionsNeedAnOperator(t *testing.T) {
	plain, _ := newAPI(t)
	withHook, _ := newOperatorAPI(t)
	for _, srv := range []*httptest.Server{plain, withHook} {
		owned := register(t, srv.URL, `{"namespace":"prod","component":"api","endpoint":"http","address":"10.0.0.1:80","ttl":"1m"}`)
		missing := beacon.Ref{Namespace: "prod", Component: "api", Endpoint: "http", ID: "00000000000000ff"}
		for _, action := range []string{"/drain", "/deregister"} {
			real := do(t, "POST", instanceURL(srv.URL, owned.Instance)+action, "")
			e := real.wantError(t, http.StatusForbidden, "permission_denied")
			for _, want := range []string{"registryapi.Config.Operators", "readwrite", "beacon auth grant-namespace"} {
				if !strings.Contains(e.Message, want) {
					t.Errorf("%s without an operator: %q does not say %q", action, e.Message, want)
				}
			}
			if other := do(t, "POST", srv.URL+InstancesPath+"/"+missing.String()+action, ""); other.code != real.code || string(other.body) != string(real.body) {
				t.Errorf("%s of a missing instance answered %d %s, of a real one %d %s", action, other.code, other.body, real.code, real.body)
			}
		}
		var got beacon.Instance
		do(t, "GET", instanceURL(srv.URL, owned.Instance), "").decode(t, &got)
		if got.Status != beacon.StatusServing {
			t.Fatalf("a refused operator action changed the instance: %+v", got)
		}
		// The owner's DELETE without a secret is still the answer of a
		// missing instance, never an operator action.
		do(t, "DELETE", instanceURL(srv.URL, owned.Instance), "").wantError(t, 404, "not_found")
		do(t, "GET", instanceURL(srv.URL, owned.Instance), "").decode(t, &got)
	}
}
