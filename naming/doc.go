// Package naming lets gRPC clients dial services by name through Beacon:
// a grpc-go resolver for beacon:///namespace/component/endpoint targets,
// fed by a registry watch, so it works over every registry backend (etcd,
// memory, file, NATS, Kubernetes).
//
//	reg, err := registry.New(st, registry.Config{}) // any store.Store
//	...
//	resolver, err := naming.DialOption(reg)
//	...
//	cc, err := grpc.NewClient("beacon:///prod/api/grpc", resolver,
//		grpc.WithTransportCredentials(insecure.NewCredentials()),
//		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`))
//
// The Builder is passed per channel (grpc.WithResolvers, which DialOption
// wraps); nothing is registered globally.
//
// # What the resolver pushes
//
// Every update is the full state: one resolver.Endpoint (one address) per
// serving instance, sorted by instance name. Draining instances, and those
// whose health check fails (beacon.Instance.Serving: unless their priority
// level is in panic), are left out at once, so balancers stop sending them new
// calls while they finish the calls they have; instances whose address is not host:port, and
// repeated addresses, are left out too (logged and counted). Each endpoint
// carries its instance in its attributes — read them in a custom balancer
// with InstanceFrom or MetadataValue (weight, zone, ...). The same
// attributes are set as BalancerAttributes on State.Addresses for
// balancers that still read addresses. Attribute values compare safely:
// no map ever reaches gRPC's comparisons (etcd#19700).
//
// # Never silently stale
//
// Build only parses the target and starts a goroutine; it never waits for
// the network. The first registry batch gives the first state. When the
// registry watch loses its store (a Stale batch), the resolver reports an
// error matching ErrStale to gRPC: the balancer keeps the instances it has
// (a store outage does not cut healthy backends off), and calls that fail
// meanwhile say why. When the watch is back, its Resync batch makes the
// resolver push the full state again. If a watch ends with an error, the
// resolver reports it (ErrWatchEnded) and watches again with backoff; only
// a closed registry ends that, with the error kept by the channel.
//
// # No instances
//
// With no serving instance the resolver reports ErrNoInstances (after
// pushing an empty state if the channel had endpoints, so that the
// balancer drops its connections). Calls then fail fast with Unavailable
// instead of waiting for their deadline, and calls made with
// grpc.WaitForReady(true) wait until an instance appears. With pick_first
// the call's error carries the resolver's message ("no serving instances
// of beacon:///prod/api/grpc: 2 registered, 1 draining, 1 failing their
// health check, 0 with an address gRPC cannot dial"); round_robin
// answers with its own "no children to pick from".
//
// # Authority
//
// The channel's :authority is endpoint.component.namespace (a DNS name a
// TLS certificate can hold), unless grpc.WithAuthority or the credentials'
// server name set one.
//
// The etcd-compatible endpoint manager and etcd:/// resolver are in
// naming/etcdnaming; docs/naming.md covers both, with the example in
// examples/greeter.
package naming
