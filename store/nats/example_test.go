package nats_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/beaconplane/beacon/store"
	bnats "github.com/beaconplane/beacon/store/nats"
)

// Open a store on the server named by NATS_URL (and the other NATS_*
// variables), register an instance under a lease, and keep the lease alive.
// (Not run: it needs a server.)
func Example() {
	cfg, err := bnats.ConfigFromEnv()
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	s, err := bnats.Open(ctx, cfg)
	if err != nil {
		log.Fatal(err) // for example: nats-server older than 2.12, or unreachable
	}
	defer s.Close()

	lease, err := s.Grant(ctx, 10*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	rev, err := s.Put(ctx, "/services/prod/api/http/00000000000000a1", []byte(`{"address":"10.0.0.1:80"}`), store.WithLease(lease.ID))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("registered at revision", rev)
	for range time.Tick(lease.TTL / 3) {
		if _, err := s.KeepAlive(ctx, lease.ID); err != nil {
			log.Fatal(err) // the lease ended: grant a new one and register again
		}
	}
}
