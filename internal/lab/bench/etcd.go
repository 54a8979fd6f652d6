package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/beaconplane/beacon/internal/lab/freeport"
	"github.com/beaconplane/beacon/server"
)

// localEtcd is an etcd cluster a scenario runs in this process through the
// server package, the code `beacon serve` runs (each member is a
// server.Server with its embedded etcd), so that the shipped binary links
// no test helper.
type localEtcd struct {
	dir  string
	srvs []*server.Server
	eps  []string
}

// givenOrLocalEtcd returns eps when there are any, else the endpoints of
// a new cluster of members members on loopback (startLocalEtcd), which
// stop stops. setup says which: external followed by the endpoints, or
// local.
func givenOrLocalEtcd(ctx context.Context, eps []string, members int, fsync bool, external, local string) (endpoints []string, setup string, stop func(), err error) {
	if len(eps) > 0 {
		return eps, external + strings.Join(eps, ","), func() {}, nil
	}
	c, err := startLocalEtcd(ctx, members, fsync)
	if err != nil {
		return nil, "", nil, err
	}
	return c.Endpoints(), local, c.Close, nil
}

// startLocalEtcd starts a cluster of members members on loopback, with
// data in a new temporary directory; fsync false runs them without
// syncing their WAL (etcd's --unsafe-no-fsync). The caller must Close it.
func startLocalEtcd(ctx context.Context, members int, fsync bool) (*localEtcd, error) {
	if members < 1 {
		return nil, fmt.Errorf("bench: %d etcd members: want at least 1", members)
	}
	dir, err := os.MkdirTemp("", "beacon-bench-etcd-")
	if err != nil {
		return nil, err
	}
	l := &localEtcd{dir: dir}
	cfgs := make([]server.Config, members)
	var initial []string
	for i := range cfgs {
		name := "m" + strconv.Itoa(i+1)
		client, peer := "http://127.0.0.1:0", "http://127.0.0.1:0"
		if members > 1 {
			// Members name each other's peer URLs before they listen.
			cp, err1 := freeport.Port()
			pp, err2 := freeport.Port()
			if err := errors.Join(err1, err2); err != nil {
				l.Close()
				return nil, err
			}
			client, peer = "http://127.0.0.1:"+strconv.Itoa(cp), "http://127.0.0.1:"+strconv.Itoa(pp)
		}
		cfgs[i] = server.Config{
			Name: name, DataDir: filepath.Join(dir, name),
			ListenClientURLs: []string{client}, ListenPeerURLs: []string{peer},
			InitialClusterToken: "beacon-bench", HTTPAddr: "127.0.0.1:0",
			UnsafeNoFsync: !fsync,
		}
		initial = append(initial, name+"="+peer)
	}
	for i := range cfgs {
		if members > 1 {
			cfgs[i].InitialCluster = strings.Join(initial, ",")
		}
		srv, err := server.New(cfgs[i])
		if err != nil {
			l.Close()
			return nil, fmt.Errorf("bench: etcd member %s: %w", cfgs[i].Name, err)
		}
		l.srvs = append(l.srvs, srv)
	}
	// Members wait for each other (a quorum) before they are ready.
	errs := make([]error, members)
	var wg sync.WaitGroup
	for i, srv := range l.srvs {
		wg.Go(func() { errs[i] = srv.Start(ctx) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		l.Close()
		return nil, fmt.Errorf("bench: start etcd: %w", err)
	}
	for _, srv := range l.srvs {
		l.eps = append(l.eps, srv.Endpoints().ClientURLs...)
	}
	return l, nil
}

// Endpoints are the members' client URLs.
func (l *localEtcd) Endpoints() []string { return l.eps }

// Close stops every member and removes the data.
func (l *localEtcd) Close() {
	var wg sync.WaitGroup
	for _, srv := range l.srvs {
		wg.Go(func() { _ = srv.Close() })
	}
	wg.Wait()
	_ = os.RemoveAll(l.dir)
}
