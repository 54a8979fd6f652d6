package proxy_test

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"github.com/beaconplane/beacon/proxy"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Example runs a readonly proxy in front of an etcd member and uses it
// with the ordinary etcd client: reads pass, writes are refused.
func Example() {
	etcd, err := etcdtest.New(etcdtest.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer etcd.Close()

	p, err := proxy.New(proxy.Config{Mode: proxy.ReadOnly, Endpoints: etcd.Endpoints()})
	if err != nil {
		fmt.Println(err)
		return
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- p.Serve(ctx, l) }()
	defer func() {
		_ = p.Close()
		<-done
	}()
	select {
	case <-p.Ready():
	case err := <-done:
		done <- err // for the deferred Close
		fmt.Println(err)
		return
	}

	direct, err := clientv3.New(clientv3.Config{Endpoints: etcd.Endpoints(), Logger: zap.NewNop()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer direct.Close()
	if _, err := direct.Put(ctx, "greeting", "hello"); err != nil {
		fmt.Println(err)
		return
	}

	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{p.Addr().String()}, Logger: zap.NewNop()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()
	resp, err := cli.Get(ctx, "greeting")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%s\n", resp.Kvs[0].Value)
	_, err = cli.Put(ctx, "greeting", "bye")
	fmt.Println(err)
	// Output:
	// hello
	// rpc error: code = Unimplemented desc = proxy: this proxy is readonly: /etcdserverpb.KV/Put is a write and is refused (send writes to a readwrite proxy or to the cluster)
}
