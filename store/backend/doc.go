// Package backend opens a store by backend name: the one place where
// BEACON_DISCOVERY_BACKEND is interpreted. Programs (the beacon binary,
// servers) use it; libraries take a store.Store and need not import it,
// since it links every backend.
//
//	cfg := backend.FromEnv() // BEACON_DISCOVERY_BACKEND and the backend's own variables
//	s, err := backend.Open(ctx, cfg)
//	if err != nil {
//		return err // an unknown name, a bad setting or an unreachable server: the error says which
//	}
//	defer s.Close()
//
// The names, and the variables each backend reads:
//
//	etcd (default)  ETCD_ENDPOINTS, ETCD_AUTH_USERNAME, ETCD_AUTH_PASSWORD,
//	                ETCD_AUTH_CA, ETCD_AUTH_CLIENT_CERT, ETCD_AUTH_CLIENT_KEY
//	memory          none
//	file            BEACON_FILE_DIR (required), BEACON_FILE_HISTORY
//	nats            NATS_URL, NATS_CREDS, NATS_USER, NATS_PASSWORD, NATS_TOKEN,
//	                NATS_CA, NATS_CERT, NATS_KEY, NATS_DOMAIN,
//	                BEACON_NATS_BUCKET, BEACON_NATS_REPLICAS
//
// "kubernetes" is reserved for a Kubernetes-native registry that does not
// sit on a store.Store and is not part of this build: Validate and Open
// refuse it with an error that says so. A bad variable is reported by Config.Validate and
// Open, naming the variable.
package backend
