// Package beacon holds the domain types of the Beacon discovery plane: the
// Instance that workers register, the naming rules (every namespace,
// component and endpoint is a DNS label; instance IDs are 16 hex digits), the
// key layout that maps instances to store keys, watch events and the
// sentinel errors shared by every package.
//
// An instance is addressed as namespace/component/endpoint/instance-id and
// stored, as JSON, at
//
//	{root}/services/{namespace}/{component}/{endpoint}/{instance_id}
//
// Beacon's writers obey those rules (Instance.Validate). What Beacon reads
// and serves, and so what a Query or Ref may name, also takes the names of
// the NVIDIA Dynamo runtime, whose registrations Beacon serves read-only
// (ValidateReadLabel, ValidateReadNamespace: '_' and namespaces nested
// with dots).
//
// Validation failures are *FieldError values that name the field, the value
// and the rule, and match ErrInvalid as well as a specific sentinel such as
// ErrInvalidName or ErrMetadataTooLarge:
//
//	if err := beacon.ValidateLabel("namespace", "Prod"); errors.Is(err, beacon.ErrInvalid) {
//		// err: beacon: invalid namespace "Prod": must be a DNS label: ...
//	}
//
// The packages below build on these types: store (the key/value contract and
// its backends), registry (leases, registration and watches), naming (gRPC
// resolution), bootstrap (etcd cluster discovery), proxy and server.
package beacon
