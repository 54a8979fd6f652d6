package dnsapi_test

import (
	"context"
	"fmt"
	"net"
	"slices"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/server/dnsapi"
	"github.com/beaconplane/beacon/store/memory"
)

// A registry's instances, answered over DNS, looked up with Go's own
// resolver.
func Example() {
	ctx := context.Background()
	st := memory.New(memory.Config{})
	defer st.Close()
	r, err := registry.New(st, registry.Config{})
	if err != nil {
		panic(err)
	}
	defer r.Close()

	srv, err := dnsapi.New(r, dnsapi.Config{}) // zone beacon.
	if err != nil {
		panic(err)
	}
	defer srv.Close()
	pc, ln, err := dnsapi.Listen("127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	if err := srv.Serve(pc, ln); err != nil {
		panic(err)
	}

	for { // until the registry's first snapshot is in
		updated := srv.Updated()
		if srv.Ready() {
			break
		}
		<-updated
	}
	for _, addr := range []string{"10.0.0.1:8080", "10.0.0.2:8080"} {
		updated := srv.Updated()
		if _, err := r.Register(ctx, beacon.Instance{Namespace: "prod", Component: "api", Endpoint: "web", Address: addr}); err != nil {
			panic(err)
		}
		<-updated // the DNS view has the instance
	}

	res := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, ln.Addr().String())
	}}
	hosts, err := res.LookupHost(ctx, "web.api.prod.beacon")
	if err != nil {
		panic(err)
	}
	slices.Sort(hosts)
	fmt.Println(hosts)
	_, srvs, err := res.LookupSRV(ctx, "web", "tcp", "api.prod.beacon")
	if err != nil {
		panic(err)
	}
	fmt.Println(len(srvs), srvs[0].Port)
	// Output:
	// [10.0.0.1 10.0.0.2]
	// 2 8080
}
