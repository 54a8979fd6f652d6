// Package registrytest is the conformance suite of the registry.Registry
// contract. Every implementation runs it from a plain `go test`, once per
// backend:
//
//	func TestConformance(t *testing.T) {
//		st := memory.New(memory.Config{})
//		t.Cleanup(func() { st.Close() })
//		registrytest.Run(t, func(t testing.TB) registry.Registry {
//			r, err := registry.New(st, registry.Config{})
//			if err != nil {
//				t.Fatal(err)
//			}
//			return r
//		}, registrytest.Options{Store: func(testing.TB) store.Store { return st }})
//	}
//
// Each guarantee of DESIGN.md's Registry contract is a named check (a
// subtest). The factory is called once per simulated process: two calls in
// one check must give two independent registries over the same backend
// (two sessions, two leases). Checks use disjoint namespaces, so one backend
// serves the whole run. An implementation that cannot offer a guarantee
// lists the check in Options.Caveats with the reason. The health checks
// ("Health/...") act as a health checker: they write verdicts beside their
// instances through Options.Store, under a lease of their own, or, without
// it, through the VerdictSink of a registry of their own
// (registry.VerdictKeeper: registry/kube, where a checker's verdicts live
// in its pod's InstanceSet).
//
// View is what a well-behaved consumer of a Watcher holds: it applies
// batches and checks the event contract as it goes (the first batch is a
// Snapshot or, after a resume, Changes; Added only for an unknown ID,
// Updated and Removed only for a known one). Tests of code built on
// watches (drills, resolvers, benchmarks) use it to compare a watcher's
// view with a List.
package registrytest
