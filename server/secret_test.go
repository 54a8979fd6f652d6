package server

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/beaconplane/beacon/server/registryapi"
)

// TestSecretAnswersDoNotTellRightFromWrong: on every route that takes a
// Beacon-Secret, over a real etcd with authentication on, a caller learns
// whether a secret is right only if it may make the change: a user who
// may read a namespace but not write it got 403 for the right secret and
// 404 for a wrong one. Now every caller the store would refuse the change
// gets the same answer, byte for byte, for a right, a wrong and a missing
// secret; a bad request body is 400 before the secret counts; callers who
// may write get 404 for a wrong secret, as for an unknown instance.
func TestSecretAnswersDoNotTellRightFromWrong(t *testing.T) {
	s := startServer(t, authConfig(t))
	root := rootClient(t, s)
	grant(t, root, "owner", "owner-pw", "readwrite /services/sec/", "readwrite /beacon-owners/sec/")
	grant(t, root, "reader", "reader-pw", "read /services/sec/", "read /beacon-owners/sec/")
	// May write instances but not their ownership records: etcd refuses
	// it a change of a registration's lease-bound keys.
	grant(t, root, "half", "half-pw", "readwrite /services/sec/", "read /beacon-owners/sec/")
	base := s.Endpoints().HTTP
	owner := as{t: t, base: base, auth: basic("owner", "owner-pw")}
	r := owner.do("POST", registryapi.InstancesPath, `{"namespace":"sec","component":"web","endpoint":"http","address":"10.0.0.1:80","ttl":"60s"}`)
	var reg registryapi.RegisterResponse
	if err := json.Unmarshal([]byte(r.body), &reg); err != nil || r.code != http.StatusCreated {
		t.Fatalf("register: %d %s", r.code, r.body)
	}
	one := registryapi.InstancesPath + "/" + reg.Instance.Ref().String()
	wrong := strings.Repeat("A", len(reg.Secret))
	secrets := map[string]string{"right": reg.Secret, "wrong": wrong, "missing": ""}
	call := func(a as, method, path, body, secret string) httpAnswer {
		if secret == "" {
			return a.do(method, path, body)
		}
		return a.do(method, path, body, registryapi.SecretHeader, secret)
	}
	// Every caller the store refuses: one answer whatever the secret.
	for _, c := range []struct {
		user, method, path, body string
	}{
		{"reader", "POST", one + "/heartbeat", ""},
		{"reader", "PATCH", one, `{"metadata":{"k":"v"}}`},
		{"reader", "DELETE", one, ""},
		{"half", "POST", one + "/heartbeat", ""},
		{"half", "PATCH", one, `{"metadata":{"k":"v"}}`},
		{"half", "DELETE", one, ""},
	} {
		a := as{t: t, base: base, auth: basic(c.user, c.user+"-pw")}
		var first httpAnswer
		for _, name := range []string{"right", "wrong", "missing"} {
			got := call(a, c.method, c.path, c.body, secrets[name])
			if got.code != http.StatusForbidden {
				t.Errorf("%s %s %s with the %s secret: %d %s, want 403", c.user, c.method, c.path, name, got.code, got.body)
			}
			if name == "right" {
				first = got
			} else if got.code != first.code || got.body != first.body {
				t.Errorf("%s %s with the %s secret answered\n%d %s\nand with the right one\n%d %s", c.user, c.method, name, got.code, got.body, first.code, first.body)
			}
		}
	}
	// A bad body is 400 whatever the secret, before it counts.
	reader := as{t: t, base: base, auth: basic("reader", "reader-pw")}
	for name, secret := range secrets {
		if got := call(reader, "PATCH", one, `{"address":"no port"}`, secret); got.code != http.StatusBadRequest {
			t.Errorf("reader PATCH with a bad address and the %s secret: %d %s, want 400", name, got.code, got.body)
		}
	}
	// A caller who may write: a wrong or missing secret is an unknown
	// instance.
	unknown := owner.do("PATCH", registryapi.InstancesPath+"/sec/web/http/00000000000000aa", `{"metadata":{"k":"v"}}`, registryapi.SecretHeader, wrong)
	for _, name := range []string{"wrong", "missing"} {
		for _, c := range []struct{ method, path, body string }{
			{"POST", one + "/heartbeat", ""}, {"PATCH", one, `{"metadata":{"k":"v"}}`}, {"DELETE", one, ""},
		} {
			got := call(owner, c.method, c.path, c.body, secrets[name])
			if got.code != http.StatusNotFound || !strings.Contains(got.body, "not_found") {
				t.Errorf("owner %s %s with the %s secret: %d %s, want 404", c.method, c.path, name, got.code, got.body)
			}
		}
	}
	if unknown.code != http.StatusNotFound {
		t.Errorf("PATCH of an unknown instance: %d %s", unknown.code, unknown.body)
	}
	// The owner's right secret works, last.
	if got := owner.do("POST", one+"/heartbeat", "", registryapi.SecretHeader, reg.Secret); got.code != http.StatusOK {
		t.Fatalf("owner heartbeat: %d %s", got.code, got.body)
	}
	if got := owner.do("PATCH", one, `{"metadata":{"k":"v"}}`, registryapi.SecretHeader, reg.Secret); got.code != http.StatusOK {
		t.Fatalf("owner PATCH: %d %s", got.code, got.body)
	}
	if got := owner.do("DELETE", one, "", registryapi.SecretHeader, reg.Secret); got.code != http.StatusNoContent {
		t.Fatalf("owner DELETE: %d %s", got.code, got.body)
	}
}
