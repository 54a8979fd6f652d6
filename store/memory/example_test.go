package memory_test

import (
	"context"
	"fmt"
	"time"

	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/memory"
)

// A value written with a lease disappears when the lease is revoked (or
// expires), and a watcher sees the deletion.
func Example() {
	ctx := context.Background()
	s := memory.New(memory.Config{})
	defer s.Close()

	lease, err := s.Grant(ctx, 10*time.Second)
	if err != nil {
		panic(err)
	}
	rev, err := s.Put(ctx, "/services/prod/api/http/00000000000000a1", []byte(`{"address":"10.0.0.1:80"}`), store.WithLease(lease.ID))
	if err != nil {
		panic(err)
	}
	kvs, listed, err := s.List(ctx, "/services/prod/")
	if err != nil {
		panic(err)
	}
	fmt.Println(len(kvs), "instance at revision", listed, "written at", rev)

	w := s.Watch(ctx, "/services/prod/", listed+1)
	if err := s.Revoke(ctx, lease.ID); err != nil {
		panic(err)
	}
	resp := <-w
	fmt.Println(resp.Events[0].Type, resp.Events[0].KV.Key)
	// Output:
	// 1 instance at revision 2 written at 2
	// DELETE /services/prod/api/http/00000000000000a1
}
