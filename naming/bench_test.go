package naming_test

import (
	"context"
	"fmt"
	"net/url"
	"testing"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/naming"
	"github.com/beaconplane/beacon/naming/internal/cctest"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store/memory"
	"google.golang.org/grpc/resolver"
)

// BenchmarkChangeToState measures one instance change, from
// Registration.Update to the full state the resolver pushes, over the
// memory backend, for targets of several sizes.
func BenchmarkChangeToState(b *testing.B) {
	for _, n := range []int{10, 1000} {
		b.Run(fmt.Sprintf("instances=%d", n), func(b *testing.B) {
			ctx := context.Background()
			st := memory.New(memory.Config{})
			defer func() { _ = st.Close() }()
			r, err := registry.New(st, registry.Config{})
			if err != nil {
				b.Fatal(err)
			}
			defer func() { _ = r.Close() }()
			q := beacon.Query{Namespace: "bench", Component: "api", Endpoint: "grpc"}
			var first registry.Registration
			for i := range n {
				reg, err := r.Register(ctx, beacon.Instance{Namespace: q.Namespace, Component: q.Component, Endpoint: q.Endpoint,
					Address: fmt.Sprintf("10.0.%d.%d:50051", i/250, i%250+1)})
				if err != nil {
					b.Fatal(err)
				}
				if i == 0 {
					first = reg
				}
			}
			bd, err := naming.NewBuilder(r)
			if err != nil {
				b.Fatal(err)
			}
			u, _ := url.Parse(naming.Target(q))
			cc := cctest.New()
			res, err := bd.Build(resolver.Target{URL: *u}, cc, resolver.BuildOptions{})
			if err != nil {
				b.Fatal(err)
			}
			defer res.Close()
			next, _ := cc.Wait(b, 0, "first state", func(e cctest.Event) bool { return e.State != nil && len(e.State.Endpoints) == n })
			next++
			b.ResetTimer()
			for i := range b.N {
				status, want := beacon.StatusDraining, n-1
				if i%2 == 1 {
					status, want = beacon.StatusServing, n
				}
				if err := first.Update(ctx, func(in *beacon.Instance) { in.Status = status }); err != nil {
					b.Fatal(err)
				}
				next, _ = cc.Wait(b, next, "state", func(e cctest.Event) bool { return e.State != nil && len(e.State.Endpoints) == want })
				next++
			}
		})
	}
}
