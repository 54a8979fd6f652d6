package xdsapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/anypb"
)

// ads is a raw ADS client, as Envoy speaks it: it sends requests and reads
// responses one by one, so that tests see the protocol itself. Every
// resource it receives is checked against Envoy's own validation rules
// (the protoc-gen-validate constraints of the envoy API), which is what
// Envoy applies before it accepts a resource.
type ads struct {
	t      testing.TB
	stream discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	node   *corev3.Node
	first  bool
}

// dialADS opens an ADS stream to addr as a node with the given user agent.
func dialADS(t testing.TB, addr, userAgent string, opts ...grpc.DialOption) *ads {
	t.Helper()
	cc, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return &ads{t: t, stream: st, first: true, node: &corev3.Node{Id: "raw-" + userAgent, UserAgentName: userAgent}}
}

// request sends a request of type typ for names, acknowledging (or, with
// nack set, refusing) the response prev (nil for none).
func (a *ads) request(typ string, names []string, prev *discoveryv3.DiscoveryResponse, nack string) {
	a.t.Helper()
	req := &discoveryv3.DiscoveryRequest{TypeUrl: typ, ResourceNames: names}
	if a.first {
		req.Node, a.first = a.node, false
	}
	if prev != nil {
		req.ResponseNonce = prev.GetNonce()
		req.VersionInfo = prev.GetVersionInfo()
		if nack != "" {
			req.VersionInfo = ""
			req.ErrorDetail = &status.Status{Code: 3, Message: nack}
		}
	}
	// io.EOF: the server ended the stream (a refusal may come before a
	// request is sent); as gRPC documents, its status comes from Recv,
	// which the test reads next.
	if err := a.stream.Send(req); err != nil && !errors.Is(err, io.EOF) {
		a.t.Fatalf("send: %v", err)
	}
}

// recv reads the next response (failing the test on a stream error) and
// validates its resources.
func (a *ads) recv() *discoveryv3.DiscoveryResponse {
	a.t.Helper()
	resp, err := a.recvErr()
	if err != nil {
		a.t.Fatalf("recv: %v", err)
	}
	return resp
}

// recvErr reads the next response, or the error that ended the stream.
func (a *ads) recvErr() (*discoveryv3.DiscoveryResponse, error) {
	a.t.Helper()
	type result struct {
		resp *discoveryv3.DiscoveryResponse
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		r, err := a.stream.Recv()
		ch <- result{r, err}
	}()
	select {
	case r := <-ch:
		if r.err == nil {
			for _, res := range r.resp.GetResources() {
				if err := validate(res); err != nil {
					a.t.Fatalf("response of type %s holds a resource Envoy would refuse: %v", r.resp.GetTypeUrl(), err)
				}
			}
		}
		return r.resp, r.err
	case <-testContext(a.t).Done():
		a.t.Fatal("no response within the test deadline")
		return nil, nil
	}
}

// validate decodes a resource and applies Envoy's validation rules to it,
// and to the HttpConnectionManager and router inside a Listener.
func validate(res *anypb.Any) error {
	m, err := res.UnmarshalNew()
	if err != nil {
		return err
	}
	v, ok := m.(interface{ ValidateAll() error })
	if !ok {
		return fmt.Errorf("%T has no validation rules", m)
	}
	if err := v.ValidateAll(); err != nil {
		return err
	}
	if l, ok := m.(*listenerv3.Listener); ok {
		hcm := &hcmv3.HttpConnectionManager{}
		if err := l.GetApiListener().GetApiListener().UnmarshalTo(hcm); err != nil {
			return err
		}
		if err := hcm.ValidateAll(); err != nil {
			return err
		}
		filters := hcm.GetHttpFilters()
		router := &routerv3.Router{}
		if len(filters) == 0 || filters[len(filters)-1].GetTypedConfig().UnmarshalTo(router) != nil {
			return fmt.Errorf("listener %s: the router is not the last HTTP filter", l.GetName())
		}
	}
	return nil
}

// names returns the resource names of a response.
func names(t testing.TB, resp *discoveryv3.DiscoveryResponse) []string {
	t.Helper()
	var out []string
	for _, r := range resp.GetResources() {
		m, err := r.UnmarshalNew()
		if err != nil {
			t.Fatal(err)
		}
		switch v := m.(type) {
		case *listenerv3.Listener:
			out = append(out, v.GetName())
		case *clusterv3.Cluster:
			out = append(out, v.GetName())
		case *endpointv3.ClusterLoadAssignment:
			out = append(out, v.GetClusterName())
		default:
			t.Fatalf("unexpected resource %T", m)
		}
	}
	return out
}

// assignments decodes the ClusterLoadAssignments of a response, by name.
func assignments(t testing.TB, resp *discoveryv3.DiscoveryResponse) map[string]*endpointv3.ClusterLoadAssignment {
	t.Helper()
	out := map[string]*endpointv3.ClusterLoadAssignment{}
	for _, r := range resp.GetResources() {
		cla := &endpointv3.ClusterLoadAssignment{}
		if err := r.UnmarshalTo(cla); err != nil {
			t.Fatal(err)
		}
		out[cla.GetClusterName()] = cla
	}
	return out
}

// addresses lists the endpoints of an assignment as "ip:port/HEALTH".
func addresses(cla *endpointv3.ClusterLoadAssignment) []string {
	var out []string
	for _, l := range cla.GetEndpoints() {
		for _, e := range l.GetLbEndpoints() {
			sa := e.GetEndpoint().GetAddress().GetSocketAddress()
			out = append(out, net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue())))+"/"+e.GetHealthStatus().String())
		}
	}
	return out
}
