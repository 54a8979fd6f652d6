package registryapi

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon/dynamo"
	"github.com/beaconplane/beacon/internal/testkit/dynamotest"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store/memory"
)

// The HTTP API over a registry of the dynamo layout: lists and gets serve
// what Dynamo writes, under its names (a nested namespace, underscores, in
// query parameters and paths); every write answers 501 saying the layout
// is a read-only view.
func TestAPIOverTheDynamoLayout(t *testing.T) {
	st := memory.New(memory.Config{})
	reg, err := registry.New(st, registry.Config{Layout: registry.LayoutDynamo})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reg.Close(); _ = st.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const ns, comp, ep = "dynamo.t_1", "vllm_worker", "clear_kv_blocks"
	val := dynamotest.EndpointValue(ns, comp, ep, 42, dynamotest.TCP("10.0.0.5:9999", ep))
	if _, err := st.Put(ctx, "v1/instances/"+ns+"/"+comp+"/"+ep+"/2a", []byte(val)); err != nil {
		t.Fatal(err)
	}
	h, err := New(reg, Config{})
	if err != nil {
		t.Fatal(err)
	}
	srv := newServer(t, h)
	base := srv.URL + InstancesPath

	var list ListResponse
	r := do(t, "GET", base+"?namespace="+ns+"&component="+comp+"&endpoint="+ep, "")
	r.decode(t, &list)
	if r.code != http.StatusOK || len(list.Instances) != 1 || list.Instances[0].Address != "10.0.0.5:9999" ||
		list.Instances[0].Metadata[dynamo.MetaInstanceID] != "42" {
		t.Fatalf("list: %d %s", r.code, r.body)
	}
	one := base + "/" + ns + "/" + comp + "/" + ep + "/000000000000002a"
	if r := do(t, "GET", one, ""); r.code != http.StatusOK || !strings.Contains(string(r.body), `"dynamo.target":"10.0.0.5:9999/clear_kv_blocks"`) {
		t.Fatalf("get: %d %s", r.code, r.body)
	}
	for _, w := range []struct{ method, url, body, secret string }{
		{"POST", base, `{"namespace":"prod","component":"api","endpoint":"http","address":"10.0.0.1:80"}`, ""},
		{"POST", one + "/heartbeat", "", "s3cret"},
		{"PATCH", one, `{"status":"draining"}`, "s3cret"},
		{"DELETE", one, "", "s3cret"},
		{"POST", one + "/drain", "", ""}, // operator actions take no secret
		{"POST", one + "/deregister", "", ""},
	} {
		r := doSecret(t, w.method, w.url, w.body, w.secret)
		e := r.wantError(t, http.StatusNotImplemented, "not_implemented")
		if !strings.Contains(e.Message, "read-only view of what the Dynamo runtime writes") {
			t.Errorf("%s %s: %q, want it to say the layout is read-only", w.method, w.url, e.Message)
		}
	}
	if kvs, _, err := st.List(ctx, ""); err != nil || len(kvs) != 1 {
		t.Fatalf("the refused writes changed the store: %v %v", kvs, err)
	}
}
