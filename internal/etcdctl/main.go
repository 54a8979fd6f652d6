// Command etcdctl is the real etcdctl 3.7.3 (go.etcd.io/etcd/etcdctl/v3),
// built from this module so that interop tests drive etcd's own client
// code against Beacon (for example through the proxy). It is a test peer,
// not part of the beacon binary.
package main

import "go.etcd.io/etcd/etcdctl/v3/ctlv3"

func main() { ctlv3.MustStart() }
