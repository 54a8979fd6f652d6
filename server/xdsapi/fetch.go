package xdsapi

import (
	"context"
	"errors"
	"fmt"
	"io"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
)

// TypeURLs names the resource types Beacon serves, as a client asks for
// them: listener, cluster and endpoint (the ClusterLoadAssignment).
var TypeURLs = map[string]string{"listener": ListenerType, "cluster": ClusterType, "endpoint": EndpointType}

// Fetch asks the xDS server behind cc once for the resources of typeURL
// named names (none: every service) and returns its answer, as a client
// sees it: the way to check what Beacon serves for a name. ctx may carry
// authorization metadata.
func Fetch(ctx context.Context, cc grpc.ClientConnInterface, typeURL string, names ...string) (*discoveryv3.DiscoveryResponse, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the stream
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx)
	if err != nil {
		return nil, err
	}
	if err := st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: typeURL, ResourceNames: names}); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("xds: send the request: %w", err)
	} // io.EOF: the server ended the stream; Recv says why
	resp, err := st.Recv()
	if err != nil {
		return nil, err
	}
	return resp, nil
}
