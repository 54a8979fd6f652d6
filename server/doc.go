// Package server is `beacon serve`: an embedded etcd member (or a front
// over an external etcd cluster, or another store backend) and one HTTP
// listener for Beacon's APIs, health and metrics.
//
// # What it runs
//
// By default the server runs a single-node etcd (the etcd 3.7 server code,
// go.etcd.io/etcd/server/v3/embed) with its data in Config.DataDir, serving
// any etcd v3 client on Config.ListenClientURLs (default
// http://127.0.0.1:2379) and its peers on Config.ListenPeerURLs (default
// http://127.0.0.1:2380). A multi-node cluster forms from
// Config.InitialCluster, as with etcd's --initial-cluster, or through an
// etcd v3 discovery token (Config.Discovery, etcd's --discovery-* flags):
// the member registers under the token with package bootstrap, waits until
// the token's cluster is complete, and starts with the initial cluster the
// registry gives. When that cluster is already full,
// DiscoveryConfig.Fallback decides: FallbackExit fails Start with
// bootstrap.ErrFullCluster; FallbackProxy serves a readwrite etcd proxy
// (package proxy) of that cluster on the client URL instead of a member.
// Config.EtcdEndpoints fronts an external cluster instead, and
// Config.Backend chooses another store (memory, file, nats) without etcd.
//
// # HTTP listener
//
// One listener, Config.HTTPAddr (default 127.0.0.1:9379), serves:
//
//	/healthz, /readyz            liveness, and readiness (etcd ready, store answers, DNS has its first snapshot)
//	/metrics                     Prometheus: Beacon's metrics and etcd's
//	/v1/registry/...             the registry API (package server/registryapi)
//	/v1/tokens[/{token}]         v3 discovery tokens (bootstrap.NewHandler)
//	/v2/discovery/...            the discovery.etcd.io-compatible v2 service (package bootstrap/v2)
//	/v1/openapi.json             the OpenAPI description of the /v1 routes
//	/v1/cluster                  etcd members' status or the backend's health (dashboard.go)
//	/ui/, /                      the web dashboard (package server/ui); / redirects to /ui/
//	/v1/auth/whoami, /v1/auth/token  who a request is and what it may do; an etcd token for Basic credentials
//
// The port is taken first in Start, and /healthz answers from that moment:
// a member waiting for its discovery peers is alive, and /readyz says it
// is still starting.
//
// # Health checks
//
// With Config.Health.Enabled (`beacon serve --health-checks`, on by
// default for store backends) the server runs a health.Checker over its
// registry and store: it registers as beacon/health/checker/<id hash>
// with its HTTP address, checks its share of the instances that declare
// a check, and writes their verdicts under a lease of its own (package
// health has the rules).
//
// # Security
//
// Config.Security configures TLS on the embedded etcd's client and peer
// listeners and on the HTTP listener (etcd's flag names; certificates
// re-read when they change), etcd authentication (Security.Auth
// bootstraps root and enables it), and the bounds of every request (body
// size, deadlines, per-client caps). With etcd authentication on, each HTTP
// request authenticates (Basic, Bearer etcd token, or a client
// certificate's CN) and is served by a view that acts as that etcd user, so
// that etcd's roles decide; the Host header is checked against the
// server's names. docs/security.md has the threat model.
//
// # Subsystems
//
// A Server is one struct per subsystem, each owning its fields:
//
//	Server
//	├── life      lifecycle: start once, goroutines (wg), failures for Wait, close once, Abort
//	├── member    the embedded etcd member, its in-process client, its data dir (member.go, discovery.go, startcheck.go)
//	├── data      the store and registry the APIs serve, the v2 service (server.go, registrybackend.go)
//	├── http      HTTP listener, server, routes; early then full handler (http.go, dashboard.go, limits.go, csrf.go, cors.go)
//	├── boot      the discovery fallback proxy (discovery.go)
//	├── dns       DNS listener and server (dns.go)
//	├── xds       xDS listener and server (xds.go)
//	├── health    the health checker: probes the instances that declare a check, writes verdicts (health.go)
//	└── security  TLS settings and reloaders, and the authenticator (tls.go, auth*.go)
//
// Authentication is one unit, the authenticator (authn.go), constructed
// with newAuthenticator from an authority (etcd's verdict on credentials:
// the embedded member in-process, or an external cluster) and its limits:
//
//	authenticator
//	├── authority       enabled? revision? open a user's store; issue a token (auth.go)
//	├── authViews       cached views acting as users, keyed by salted credential hashes (auth.go)
//	├── loginThrottle   failures per (address, user); accepted credentials; one check at a time per noisy address (auththrottle.go)
//	└── authRevisions   etcd's auth revision, read every second while a watch served to a user listens (authwatch.go)
//
// The HTTP API (requireAuth, whoami, issueToken) and xDS (authorizeXDS)
// call its checkIdentity and guardCheck; authViews and loginThrottle
// each hold their own lock, never both.
//
// A user's reads and writes go through its view, as the user, except
// watches: those come from the server's own registry (one copy of every
// watched state, however many users watch), opened once etcd answered a
// probe made as the user on the exact range the watch covers, and ended
// when etcd no longer does (userRegistry, guardedWatch: authwatch.go).
// xDS reads its index, which follows the same registry, the same way
// (xdsAccess).
//
// # Locks
//
// No type here takes two locks: lifecycle.mu (started), httpState.mu
// (srv), bootstrapState.mu, clusterAPI.mu, frontAuthority.mu, authViews.mu,
// loginThrottle.mu, authRevisions.mu and tokenSource.mu (held while it fetches a token from
// etcd, which takes none of these) are each released before another is
// taken.
//
// # Lifecycle
//
// New validates a Config (every zero value has a documented default).
// Start brings the server up and returns once it serves, stopping
// everything it started if it fails; Wait serves until the context ends or
// a component fails; Run is Start then Wait. Close shuts down gracefully
// within Config.ShutdownTimeout, is idempotent, and waits for every
// goroutine the server started.
//
//	Start:  listen HTTP, DNS, xDS ─▶ serve /healthz (early) ─▶ open the data
//	        (embedded member | registry backend | store) ─▶ full HTTP routes ─▶ DNS, xDS, health checker ─▶ ready
//	Close:  HTTP (streams end, saying why; requests drain, those left at the timeout are cut) ─▶ DNS ─▶ xDS
//	        ─▶ health checker ─▶ fallback proxy ─▶ authenticator ─▶ v2, registry, store ─▶ in-process client
//	        ─▶ etcd's client RPCs (a second, then its streams are ended) ─▶ embedded etcd ─▶ wait for goroutines
//
// Every user stops before what it uses. A stop succeeds however its
// clients behave: a request still open at the timeout is cut, with a
// warning, and a stream whose client does not read is ended within a
// second. When embedded etcd stops on its
// own, the server asks etcd whether this member was removed (its applied
// membership, else the other members' member list) and says what to do.
//
// The server logs through the injected Config.Logger (etcd's own logs
// too, at Config.EtcdLogLevel and above). Its errors name the Config
// field to change (e.g. Config.HTTPAddr); `beacon serve` says which flag
// sets it.
package server
