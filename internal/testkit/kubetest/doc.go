// Package kubetest runs a real Kubernetes control plane for tests: an etcd
// 3.7 embedded in the test process (internal/testkit/etcdtest), and the real
// kube-apiserver and kube-controller-manager built from the k8s.io/kubernetes
// modules by .ci/build-peers (found with testpeer.Built). The controller
// manager runs only the EndpointSlice controller and the garbage collector.
// There is no kubelet and no scheduler: tests create Pods bound to a Node
// object and act as the kubelet by setting pod status (IP, phase, Ready)
// through the status subresource; the real EndpointSlice controller then
// publishes the pods' readiness, and the real garbage collector deletes
// objects owned by a deleted pod.
//
// One control plane is shared by the tests of a package (Shared, stopped by
// StopShared from TestMain), so a package pays its start (about 5 s) once;
// each test works in a namespace of its own (Namespace). Without the
// binaries the tests skip, with the command that builds them, or fail when
// BEACON_REQUIRE_PEERS is set.
package kubetest
