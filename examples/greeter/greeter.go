// Package greeter is Beacon's gRPC naming example: a server that registers
// itself in the registry (over etcd, e.g. `beacon serve`) and a client that
// dials beacon:///demo/greeter/grpc and follows the servers as they come,
// drain and go.
//
// The service is hand-written — a grpc.ServiceDesc with a JSON codec — so
// the example needs no protoc toolchain. Run it (see docs/naming.md):
//
//	beacon serve &
//	go run ./examples/greeter/server --addr 127.0.0.1:50051 --name one &
//	go run ./examples/greeter/server --addr 127.0.0.1:50052 --name two &
//	go run ./examples/greeter/client
package greeter

import (
	"context"
	"encoding/json"
	"fmt"

	"google.golang.org/grpc"
)

// HelloRequest is the request of SayHello.
type HelloRequest struct {
	Name string `json:"name"`
}

// HelloReply is the reply of SayHello.
type HelloReply struct {
	Message string `json:"message"`
	// Server names the server that answered.
	Server string `json:"server"`
}

// Server is the service.
type Server interface {
	SayHello(ctx context.Context, req *HelloRequest) (*HelloReply, error)
}

// Method is the full name of SayHello.
const Method = "/greeter.Greeter/SayHello"

// ServiceDesc describes the service to grpc.Server.RegisterService, as
// protoc-gen-go-grpc would.
var ServiceDesc = grpc.ServiceDesc{
	ServiceName: "greeter.Greeter",
	HandlerType: (*Server)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "SayHello",
		Handler:    sayHelloHandler,
	}},
	Metadata: "examples/greeter/greeter.go",
}

// sayHelloHandler has grpc-go's method handler signature, context second.
func sayHelloHandler(srv any, ctx context.Context, //nolint:revive // grpc.MethodHandler's signature
	dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	in := new(HelloRequest)
	if err := dec(in); err != nil {
		return nil, err
	}
	if interceptor == nil {
		return srv.(Server).SayHello(ctx, in)
	}
	info := &grpc.UnaryServerInfo{Server: srv, FullMethod: Method}
	return interceptor(ctx, in, info, func(ctx context.Context, req any) (any, error) {
		return srv.(Server).SayHello(ctx, req.(*HelloRequest))
	})
}

// SayHello calls the service on cc.
func SayHello(ctx context.Context, cc grpc.ClientConnInterface, req *HelloRequest, opts ...grpc.CallOption) (*HelloReply, error) {
	out := new(HelloReply)
	opts = append(opts, grpc.ForceCodec(Codec{}))
	if err := cc.Invoke(ctx, Method, req, out, opts...); err != nil {
		return nil, err
	}
	return out, nil
}

// Codec encodes messages as JSON (content type application/grpc+json).
// Servers use it with grpc.ForceServerCodec, clients with grpc.ForceCodec.
type Codec struct{}

// Marshal implements encoding.Codec.
func (Codec) Marshal(v any) ([]byte, error) { return json.Marshal(v) }

// Unmarshal implements encoding.Codec.
func (Codec) Unmarshal(data []byte, v any) error {
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("greeter: decode %T: %w", v, err)
	}
	return nil
}

// Name implements encoding.Codec.
func (Codec) Name() string { return "json" }
