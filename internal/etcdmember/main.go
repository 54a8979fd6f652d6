// Command etcdmember is a real etcd 3.7.3 member (go.etcd.io/etcd/server/v3's
// etcdmain, the code of the etcd binary), built from this module so that
// fault drills run members as separate processes: they can be stopped
// (SIGSTOP), killed (SIGKILL), restarted and cut off from the network. It
// takes etcd's flags; `etcdmember grpc-proxy start ...` is etcd's grpc-proxy.
// It is a test peer, not part of the beacon binary.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
