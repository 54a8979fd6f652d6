// Package lab holds the tooling of `beacon bench` and of the fault drills:
// the benchmark scenarios (bench), the drills (drill), etcd members run as
// processes (etcdproc, and the etcd 3.7 server and its slow-disk build in
// etcd), network partitions through namespaces (netcut), free loopback
// ports (freeport) and the xDS client process of the benchmarks (xdsprobe).
//
// It is linked into the beacon binary only through `beacon bench`: no
// serving package (registry, store, naming, proxy, server, bootstrap)
// imports anything below internal/lab, which cmd/beacon's TestLayout
// checks. Tests use these packages too, to run real processes and faults.
package lab
