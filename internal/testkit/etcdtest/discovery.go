package etcdtest

import "go.etcd.io/etcd/server/v3/embed"

// WithDiscovery returns an Options.Configure function that makes the
// member bootstrap through etcd's v3 discovery (--discovery-token,
// --discovery-endpoints) instead of a static initial cluster. Such a member
// only becomes ready once the token is full, so start the members of one
// token concurrently.
func WithDiscovery(token string, endpoints []string) func(*embed.Config) {
	return func(cfg *embed.Config) {
		cfg.InitialCluster = ""
		cfg.DiscoveryCfg.Token = token
		cfg.DiscoveryCfg.Endpoints = endpoints
	}
}
