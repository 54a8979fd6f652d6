// Package etcdproc runs a cluster of etcd members as separate processes —
// etcd's own binary (built from etcd 3.7.3 as internal/lab/etcd) or
// `beacon serve` nodes — so that fault drills can do to them what happens
// in production: stop a member (SIGSTOP: it accepts connections and
// answers nothing), kill it (SIGKILL), restart it on its data, and, with
// members in network namespaces, cut one off from the others and heal it.
//
// It has no test dependencies: the tests (through internal/testkit/etcdtest) and
// `beacon bench drill` (through internal/lab/drill) both use it. Every member
// process dies with the process that started it (Pdeathsig), and Close
// removes every namespace and link it made.
package etcdproc
