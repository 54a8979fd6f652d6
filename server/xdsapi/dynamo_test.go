package xdsapi

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/testkit/dynamotest"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store/memory"
)

// Over a registry of the dynamo layout, xDS serves the NVIDIA Dynamo
// runtime's names: a nested namespace and underscores, in the DNS-like
// form (read from the left) and the slash form.
func TestDynamoNamesServed(t *testing.T) {
	st := memory.New(memory.Config{})
	r, err := registry.New(st, registry.Config{Layout: registry.LayoutDynamo})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close(); _ = st.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	val := dynamotest.EndpointValue("dynamo.t_1", "backend", "clear_kv_blocks", 42, dynamotest.TCP("127.0.0.1:5001", "clear_kv_blocks"))
	if _, err := st.Put(ctx, "v1/instances/dynamo.t_1/backend/clear_kv_blocks/2a", []byte(val)); err != nil {
		t.Fatal(err)
	}
	_, addr := startXDS(t, r, Config{})
	a := dialADS(t, addr, "raw")
	const dotted, slash = "clear_kv_blocks.backend.dynamo.t_1", "dynamo.t_1/backend/clear_kv_blocks"
	a.request(ListenerType, []string{dotted, slash}, nil, "")
	if got := names(t, a.recv()); !slices.Equal(got, []string{dotted, slash}) {
		t.Fatalf("LDS answered %v", got)
	}
	a.request(EndpointType, []string{dotted}, nil, "")
	if got := addresses(assignments(t, a.recv())[dotted]); !slices.Equal(got, []string{"127.0.0.1:5001/HEALTHY"}) {
		t.Fatalf("EDS answered %v", got)
	}
}
