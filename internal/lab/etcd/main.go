// Command etcd is the real etcd 3.7 server binary (go.etcd.io/etcd/server/v3
// etcdmain), built from this module's own dependencies so that tests and
// `beacon bench` can run etcd members as separate processes (to stop them
// with SIGSTOP, kill, restart and cut them off from the network in fault
// drills, or to measure their CPU) and etcd's own gRPC proxy (`etcd
// grpc-proxy start`) beside Beacon's. It is a test and benchmark peer, not
// part of the beacon binary.
//
//	go build -o "$HOME/.cache/beacon-peers/bin/etcd" ./internal/lab/etcd
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
