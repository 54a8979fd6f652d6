package proxy

import (
	"crypto/tls"
	"fmt"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
)

var poolSeq atomic.Uint64

// pool is the set of plain gRPC connections requests are forwarded on,
// each balancing round-robin over the usable endpoints (which the director
// sets). Keeping them free of client-side interceptors keeps the hop cheap.
type pool struct {
	conns []*grpc.ClientConn
	res   []*manual.Resolver
}

func newPool(n int, eps []string, tlsCfg *tls.Config, dialTimeout time.Duration) (*pool, error) {
	creds := insecure.NewCredentials()
	if len(eps) > 0 && strings.HasPrefix(eps[0], "https://") {
		c := tlsCfg
		if c == nil {
			c = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		creds = credentials.NewTLS(c)
	}
	p := &pool{}
	for range n {
		r := manual.NewBuilderWithScheme(fmt.Sprintf("beacon-proxy-%d", poolSeq.Add(1)))
		r.InitialState(resolver.State{Addresses: addrs(eps)})
		conn, err := grpc.NewClient(r.Scheme()+":///etcd",
			grpc.WithResolvers(r),
			grpc.WithTransportCredentials(creds),
			grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`),
			grpc.WithConnectParams(grpc.ConnectParams{
				Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second},
				MinConnectTimeout: dialTimeout,
			}),
			grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second}),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMsgSize), grpc.MaxCallSendMsgSize(maxMsgSize)),
		)
		if err != nil {
			p.close()
			return nil, err
		}
		conn.Connect()
		p.conns = append(p.conns, conn)
		p.res = append(p.res, r)
	}
	return p, nil
}

func addrs(eps []string) []resolver.Address {
	out := make([]resolver.Address, 0, len(eps))
	for _, ep := range eps {
		if u, err := url.Parse(ep); err == nil && u.Host != "" {
			out = append(out, resolver.Address{Addr: u.Host, ServerName: u.Hostname()})
		}
	}
	return out
}

// set points every connection at eps.
func (p *pool) set(eps []string) {
	st := resolver.State{Addresses: addrs(eps)}
	for _, r := range p.res {
		r.UpdateState(st)
	}
}

// resetBackoff makes every connection that is backing off from a failure
// try again now.
func (p *pool) resetBackoff() {
	for _, c := range p.conns {
		c.ResetConnectBackoff()
	}
}

func (p *pool) close() {
	for _, c := range p.conns {
		_ = c.Close()
	}
}
