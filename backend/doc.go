// Package backend opens a store, or a registry, by backend name: the one
// place where BEACON_DISCOVERY_BACKEND is interpreted. Programs (the beacon binary,
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
//	file            BEACON_FILE_DIR (required), BEACON_FILE_HISTORY,
//	                BEACON_FILE_HISTORY_BYTES
//	nats            NATS_URL, NATS_CREDS, NATS_USER, NATS_PASSWORD, NATS_TOKEN,
//	                NATS_CA, NATS_CERT, NATS_KEY, NATS_DOMAIN,
//	                BEACON_NATS_BUCKET, BEACON_NATS_REPLICAS
//
//	kubernetes      a registry, not a store: see below
//
// Backends that are registries of their own register a registry driver
// (see registry.RegisterDriver): "kubernetes" is linked by importing
// github.com/beaconplane/beacon/registry/kube (the beacon command does), which
// reads its settings from POD_NAME, POD_NAMESPACE, POD_UID, CONTAINER_NAME,
// KUBECONFIG and BEACON_KUBE_NAMESPACES (Config.DriverEnv overrides them).
// Such a backend is opened with OpenRegistry; Open refuses it
// (ErrNotAStore). A program that does not
// import the driver refuses "kubernetes" with an error naming the import.
// A bad variable is reported by Config.Validate and Open, naming the
// variable.
//
// NVIDIA Dynamo's selector, DYN_DISCOVERY_BACKEND, is read when
// BEACON_DISCOVERY_BACKEND is unset; every value Dynamo accepts selects
// Beacon's backend of that kind (DynamoName): kubernetes, etcd and its
// older name kv_store, file and mem (memory). The backends stay Beacon's:
// keys under /services/, not Dynamo's v1/instances/, and the file store in
// BEACON_FILE_DIR in Beacon's format, not Dynamo's DYN_FILE_KV directory.
//
//	r, err := backend.OpenRegistry(ctx, backend.FromEnv(), registry.Config{})
//	if err != nil {
//		return err
//	}
//	defer r.Close() // closes the store too
//
// What the registry reads in the store is the registry's Config.Layout,
// not the backend's: registry.ConfigFromEnv reads it from BEACON_LAYOUT.
// With registry.LayoutDynamo, a registry over a store (etcd: the store
// Dynamo deployments use) is a read-only view of the Dynamo runtime's own
// keys (v1/instances/..., docs/dynamo.md); the kubernetes driver refuses it.
//
//	rc, err := registry.ConfigFromEnv() // BEACON_LAYOUT=dynamo, BEACON_LEASE_TTL
//	...
//	r, err := backend.OpenRegistry(ctx, backend.FromEnv(), rc)
package backend
