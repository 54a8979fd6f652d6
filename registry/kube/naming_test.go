package kube_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/backend"
	"github.com/beaconplane/beacon/internal/testkit/kubetest"
	"github.com/beaconplane/beacon/naming"
	"github.com/beaconplane/beacon/registry"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// The beacon:/// gRPC resolver over the Kubernetes registry, opened by name
// as a program does (BEACON_DISCOVERY_BACKEND=kubernetes through
// backend): a real gRPC server registered from a Ready pod is
// called; once the pod is NotReady, calls fail fast (Unavailable: no
// serving instances).
func TestResolverOverKubernetes(t *testing.T) {
	cp := kubetest.Shared(t)
	ns := cp.Namespace(t)
	pod := cp.ReadyPod(t, ns, "grpc")
	kc := t.TempDir() + "/kubeconfig"
	if err := kubetest.WriteKubeconfig(kc, cp.Admin(), ns); err != nil {
		t.Fatal(err)
	}
	t.Setenv(backend.EnvVar, "")
	t.Setenv(backend.DynamoEnvVar, "kubernetes")
	t.Setenv("KUBECONFIG", kc)
	for k, v := range map[string]string{"POD_NAME": pod.Name, "POD_NAMESPACE": ns, "POD_UID": string(pod.UID), "CONTAINER_NAME": ""} {
		t.Setenv(k, v)
	}
	ctx := kubetest.Ctx(t)
	r, err := backend.OpenRegistry(ctx, backend.FromEnv(), registry.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	register(t, r, beacon.Instance{Namespace: "demo", Component: "api", Endpoint: "grpc", Address: lis.Addr().String(), Transport: "grpc"})

	resolver, err := naming.DialOption(r)
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient("beacon:///demo/api/grpc", resolver, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	hc := healthpb.NewHealthClient(cc)
	if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("call through beacon:///: %v", err)
	}
	cp.SetReady(t, pod, false)
	// Wait for the resolver to drop the instance: calls then fail fast.
	var seen []string
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := hc.Check(cctx, &healthpb.HealthCheckRequest{})
		cancel()
		// Dropped: calls fail fast, with the resolver's "no serving
		// instances" or gRPC's "produced zero addresses" (whichever of the
		// resolver's empty state and its error the call sees first).
		if status.Code(err) == codes.Unavailable &&
			(strings.Contains(err.Error(), "no serving instances") || strings.Contains(err.Error(), "zero addresses")) {
			break
		}
		seen = append(seen, fmt.Sprintf("%v (state %v)", err, cc.GetState()))
		if ctx.Err() != nil {
			list, _, lerr := r.List(context.Background(), beacon.Query{Namespace: "demo"})
			t.Fatalf("after the pod went NotReady, calls gave: %v; List = %v, %v", seen, list, lerr)
		}
		// The resolver's update is asynchronous; wait for the channel to
		// leave its current state before calling again — or call again
		// after 2 s: a call that blocked (its pick before the update) can
		// leave the channel in the state it will keep (a CI run waited
		// out the test's deadline here in TRANSIENT_FAILURE).
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		cc.WaitForStateChange(sctx, cc.GetState())
		cancel()
	}
}
