// Package testkit holds helpers that only tests link: an embedded etcd
// (etcdtest), a real kube-apiserver (kubetest), an in-process NATS server
// (natstest), what the NVIDIA Dynamo runtime writes to etcd (dynamotest),
// certificates (testcerts), the third-party peers the tests run
// (testpeer), the conformance cases every registry backend passes
// (backendtest) and checked instances with a verdict of the test's choosing
// (healthtest).
//
// No production file imports a package below internal/testkit and the
// beacon binary links none of them; cmd/beacon's TestBinaryLinksNoTestCode
// and TestLayout check both.
package testkit
