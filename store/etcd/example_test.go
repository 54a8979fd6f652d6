package etcd_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"time"

	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/etcd"
)

// Connecting from the environment (ETCD_ENDPOINTS, ETCD_AUTH_*), registering
// a key bound to a lease, and watching the prefix from the listing on.
func Example() {
	ctx := context.Background()
	cfg := etcd.ConfigFromEnv()
	cfg.Logger = slog.Default()
	s, err := etcd.Open(ctx, cfg)
	if err != nil {
		log.Fatal(err) // e.g. "store: backend unavailable: etcd at http://localhost:2379 did not answer within 5s ..."
	}
	defer s.Close()

	lease, err := s.Grant(ctx, 10*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := s.Put(ctx, "/services/prod/api/http/00000000000000a1", []byte(`{"address":"10.0.0.1:80"}`), store.WithLease(lease.ID)); err != nil {
		log.Fatal(err)
	}
	kvs, rev, err := s.List(ctx, "/services/prod/")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(kvs), "instances at revision", rev)
	for resp := range s.Watch(ctx, "/services/prod/", rev+1) {
		if resp.Err != nil {
			log.Fatal(resp.Err) // a *store.CompactedError means: list again
		}
		for _, e := range resp.Events {
			fmt.Println(e.Type, e.KV.Key)
		}
	}
}

func ExampleConfig_Validate() {
	cfg := etcd.Config{
		Endpoints: etcd.SplitEndpoints("https://etcd-0:2379, etcd-1:2379"),
		CA:        "/etc/etcd/ca.pem",
		Username:  "beacon",
	}
	fmt.Println(cfg.Validate())
	cfg.Password = "s3cret"
	fmt.Println(cfg.Validate())
	cfg.Endpoints = append(cfg.Endpoints, "http://etcd-2:2379")
	fmt.Println(cfg.Validate())
	// Output:
	// etcd: invalid config: Username "beacon" is set but Password is empty (set both, e.g. ETCD_AUTH_USERNAME and ETCD_AUTH_PASSWORD, or neither)
	// <nil>
	// etcd: invalid config: endpoints mix https and http: use one scheme for the whole cluster
}
