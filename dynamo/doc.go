// Package dynamo reads the registrations that the NVIDIA Dynamo runtime
// (github.com/ai-dynamo/dynamo, lib/runtime/src/discovery) writes, and turns
// them into Beacon instances. It is the schema alone: no store, no
// Kubernetes client, no registry. registry.LayoutDynamo serves a store's
// Dynamo keys through it; a Kubernetes reader of DynamoWorkerMetadata
// resources can decode their spec.data values with the same functions
// (Decode takes the key and the value, whatever held them).
//
// # What Dynamo writes
//
// In etcd (and its other key/value stores), with no leading '/':
//
//	v1/instances/{namespace}/{component}/{endpoint}/{instance_id}            an endpoint instance
//	v1/mdc/{namespace}/{component}/{endpoint}/{instance_id}[/{suffix}]       a model deployment card
//
// The instance ID is lower-case hex without padding ("2a"); padded IDs
// ("000000000000002a") are read too. Values are the JSON of a tagged union,
// "type" naming the variant:
//
//	{"type":"Endpoint","namespace":"dynamo","component":"backend","endpoint":"generate",
//	 "instance_id":42,"transport":{"tcp":"10.0.0.5:9999/generate"},
//	 "device_type":null,"request_plane_codec":"msgpack"}
//	{"type":"Model","namespace":"dynamo","component":"backend","endpoint":"generate",
//	 "instance_id":42,"card_json":{"display_name":"Qwen/Qwen3-0.6B",...},"model_suffix":null}
//
// instance_id is a JSON number (a u64). Other buckets under v1/ (event
// channels and sources, claims) are not instances: Decode answers
// ErrNotServed for them, and readers skip them silently.
//
// # What it becomes
//
// An Endpoint value is one beacon.Instance: its names as in the key, its ID
// the instance ID as 16 hex digits (beacon.FormatID), its address and
// transport from the externally tagged "transport":
//
//	transport                                    Address                      Transport
//	{"tcp":"10.0.0.5:9999/generate"}             10.0.0.5:9999                tcp
//	{"http":"http://10.0.0.5:8888/v1/rpc/gen"}   10.0.0.5:8888 (80 if none)   http
//	{"http":"https://h.example:8443/v1/rpc/gen"} h.example:8443 (443 if none) https
//	{"nats_tcp":"dynamo_backend.generate-2a"}    nats:///dynamo_backend.generate-2a   nats
//
// and its metadata keeps what Dynamo's frontends use and Beacon's fields do
// not hold: MetaInstanceID (the instance ID in decimal, as the value has
// it), MetaTarget (the transport's string: the TCP path, the HTTP URL, the
// NATS subject, on the deployment's own NATS server), MetaKey (the key it
// was read from), and, when the value has them, MetaDeviceType and
// MetaCodec. Fields Dynamo may add later are ignored.
//
// A Model value names a model: the display_name of its card_json. A
// Catalog joins each instance with the cards stored under the same
// namespace, component, endpoint and instance ID (any suffix): the sorted
// display names, comma separated, are its MetaModels. That is how Dynamo's
// frontends learn which models an instance serves.
//
// # Bad entries
//
// Every entry Beacon cannot serve is an *EntryError naming the key and
// what was wrong (matching ErrMalformed): a value that is not JSON, an
// unknown "type", a type in the wrong bucket, an instance_id that is
// negative, fractional or above 2^64-1, a key with too few or too many
// segments, a name outside beacon.ValidateReadLabel/ValidateReadNamespace,
// a value whose names or ID disagree with its key, a transport Beacon
// does not know. A Catalog refuses two instance entries that map to one
// Beacon ref (a padded and an unpadded ID): neither is served while both
// exist (Catalog.Colliding), rather than one silently winning.
package dynamo
