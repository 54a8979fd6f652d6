package file_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/file"
)

// Processes on one host share a store through a directory. Here one process
// registers a leased key and a watcher sees it go when the lease ends.
func Example() {
	dir, err := os.MkdirTemp("", "beacon-example-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	ctx := context.Background()

	s, err := file.Open(ctx, file.Config{Dir: dir})
	if err != nil {
		panic(err)
	}
	defer s.Close()

	lease, err := s.Grant(ctx, 10*time.Second)
	if err != nil {
		panic(err)
	}
	key := "/services/prod/api/http/00000000000000a1"
	if _, err := s.Put(ctx, key, []byte(`{"address":"10.0.0.1:80"}`), store.WithLease(lease.ID)); err != nil {
		panic(err)
	}
	kvs, rev, err := s.List(ctx, "/services/prod/")
	if err != nil {
		panic(err)
	}
	fmt.Println(len(kvs), "instance at revision", rev)

	w := s.Watch(ctx, "/services/prod/", rev+1)
	if err := s.Revoke(ctx, lease.ID); err != nil {
		panic(err)
	}
	resp := <-w
	fmt.Println(resp.Events[0].Type, resp.Events[0].KV.Key)
	// Output:
	// 1 instance at revision 2
	// DELETE /services/prod/api/http/00000000000000a1
}
