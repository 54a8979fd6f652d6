package drill

import (
	"context"
	"sync"
	"time"

	"github.com/beaconplane/beacon/internal/etcdproc"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// reference tells when etcd itself deleted a key: one raw watch per
// member, each on a client of its own, so that at least one member that
// answers reports a deletion promptly whatever the others do. It tells
// etcd's share of a phantom (a lease expiring late) from the watchers'
// (a watch lagging behind the store).
type reference struct {
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	clients []*clientv3.Client

	mu      sync.Mutex
	deleted map[string]time.Time // key → first deletion seen
}

func newReference(c *etcdproc.Cluster, prefix string) *reference {
	ctx, cancel := context.WithCancel(context.Background())
	ref := &reference{cancel: cancel, deleted: map[string]time.Time{}}
	for _, m := range c.Members() {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{m.ClientURL}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			continue
		}
		ref.clients = append(ref.clients, cli)
		ref.wg.Go(func() {
			for wr := range cli.Watch(ctx, prefix, clientv3.WithPrefix()) {
				now := time.Now()
				ref.mu.Lock()
				for _, e := range wr.Events {
					if e.Type != mvccpb.DELETE {
						continue
					}
					if _, seen := ref.deleted[string(e.Kv.Key)]; !seen {
						ref.deleted[string(e.Kv.Key)] = now
					}
				}
				ref.mu.Unlock()
			}
		})
	}
	return ref
}

// deletedAt returns when key was first seen deleted (zero: not yet).
func (ref *reference) deletedAt(key string) time.Time {
	ref.mu.Lock()
	defer ref.mu.Unlock()
	return ref.deleted[key]
}

func (ref *reference) close() {
	ref.cancel()
	for _, cli := range ref.clients {
		_ = cli.Close()
	}
	ref.wg.Wait()
}
