package drill

import (
	"context"
	"sync"
	"time"

	"github.com/beaconplane/beacon/internal/lab/etcdproc"
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
	deleted map[string][]time.Time // key → deletions seen (a key may be written again)
}

func newReference(c *etcdproc.Cluster, prefix string) *reference {
	ctx, cancel := context.WithCancel(context.Background())
	ref := &reference{cancel: cancel, deleted: map[string][]time.Time{}}
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
					// Every member reports each deletion: one a second
					// after the last seen is a new one.
					key := string(e.Kv.Key)
					if ds := ref.deleted[key]; len(ds) == 0 || now.Sub(ds[len(ds)-1]) > time.Second {
						ref.deleted[key] = append(ds, now)
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
	return ref.deletedAfter(key, time.Time{})
}

// deletedAfter returns when key was first seen deleted after t (zero: not
// yet).
func (ref *reference) deletedAfter(key string, t time.Time) time.Time {
	ref.mu.Lock()
	defer ref.mu.Unlock()
	for _, at := range ref.deleted[key] {
		if at.After(t) {
			return at
		}
	}
	return time.Time{}
}

// waitDeleted waits up to within (polling every 10 ms: the deletion was
// already seen by a client, the raw watches may trail it by a little) for
// key's first deletion after after and returns when it was seen (zero: not
// within).
func (ref *reference) waitDeleted(ctx context.Context, key string, after time.Time, within time.Duration) time.Time {
	deadline := time.Now().Add(within)
	for {
		if at := ref.deletedAfter(key, after); !at.IsZero() || time.Now().After(deadline) {
			return at
		}
		if sleepCtx(ctx, 10*time.Millisecond) != nil {
			return time.Time{}
		}
	}
}

func (ref *reference) close() {
	ref.cancel()
	for _, cli := range ref.clients {
		_ = cli.Close()
	}
	ref.wg.Wait()
}
