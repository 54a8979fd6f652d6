package naming_test

import (
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/testkit/dynamotest"
	"github.com/beaconplane/beacon/naming"
	"github.com/beaconplane/beacon/naming/namingtest"
	"github.com/beaconplane/beacon/registry"
)

// The beacon:/// resolver over a registry of the dynamo layout: two
// Dynamo workers (written as the runtime writes them, on their leases)
// whose TCP request plane is a real gRPC server each, under Dynamo's names
// (a nested namespace, an underscore); RPCs reach both, and one worker's
// lease revoked moves every RPC to the other.
func TestResolverFollowsDynamoWorkers(t *testing.T) {
	ctx := testContext(t)
	q := beacon.Query{Namespace: "dynamo.naming_1", Component: "vllm_worker", Endpoint: "clear_kv_blocks"}
	b1, b2 := namingtest.Start(t, "b1"), namingtest.Start(t, "b2")
	cli := server.Client(t)
	w1 := dynamotest.Start(t, cli, time.Minute, true)
	w2 := dynamotest.Start(t, cli, time.Minute, true)
	w1.Endpoint(t, q.Namespace, q.Component, q.Endpoint, dynamotest.TCP(b1.Addr(), q.Endpoint))
	w2.Endpoint(t, q.Namespace, q.Component, q.Endpoint, dynamotest.TCP(b2.Addr(), q.Endpoint))

	client := newRegistry(t, newEtcdStore(t, nil), registry.Config{Layout: registry.LayoutDynamo})
	target := naming.Target(q)
	if target != "beacon:///dynamo.naming_1/vllm_worker/clear_kv_blocks" {
		t.Fatalf("Target = %q", target)
	}
	cc := dial(t, memBuilder(t, client), target, "round_robin")
	untilAll(ctx, t, cc, "b1", "b2")

	w1.Revoke(t)
	untilOnly(ctx, t, cc, 20, "b2")
}
