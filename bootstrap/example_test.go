package bootstrap_test

import (
	"context"
	"fmt"
	"time"

	"github.com/beaconplane/beacon/bootstrap"
	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// The ID etcd gives a member that bootstraps through discovery, and the
// key it registers under.
func ExampleMemberID() {
	id, err := bootstrap.MemberID([]string{"http://127.0.0.2:21380"}, "tok-1795320230")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(bootstrap.FormatID(id))
	fmt.Println(bootstrap.MemberKey("tok-1795320230", id))
	v, _ := bootstrap.MemberValue("m6", []string{"http://127.0.0.3:26380", "http://127.0.0.2:26380"})
	fmt.Println(v)
	// Output:
	// e490a1f97716759f
	// /_etcd/registry/tok-1795320230/members/e490a1f97716759f
	// m6=http://127.0.0.2:26380,m6=http://127.0.0.3:26380
}

// Create a token, join as a member, and start etcd with the answer. The
// discovery service here is an embedded test etcd; in production it is
// `beacon serve` or any etcd cluster.
func ExampleJoin() {
	registry, err := etcdtest.New(etcdtest.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer registry.Close()
	cfg := registry.ClientConfig()
	cfg.Logger = zap.NewNop()
	cli, err := clientv3.New(cfg)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	const token = "example-token"
	if _, err := bootstrap.CreateToken(ctx, cli, token, 1); err != nil {
		fmt.Println(err)
		return
	}
	cluster, err := bootstrap.Join(ctx, bootstrap.Config{Token: token, Endpoints: registry.Endpoints()},
		"infra1", []string{"http://10.0.1.10:2380"},
		bootstrap.WithProgress(func(p bootstrap.Progress) { fmt.Println(p) }))
	if err != nil {
		fmt.Println(err)
		return
	}
	// Start etcd with --initial-cluster=<InitialCluster>
	// --initial-cluster-token=<Token> --initial-cluster-state=new.
	fmt.Println(cluster.InitialCluster, cluster.Token)
	// Output:
	// 1 of 1 members registered (infra1)
	// infra1=http://10.0.1.10:2380 example-token
}
