// Package bootstrap implements etcd's v3 discovery protocol, with which the
// members of a new etcd cluster (or of Beacon servers) find each other
// through a shared token, and the administration of tokens.
//
// # Protocol
//
// A token lives in a discovery registry, any etcd cluster (typically the
// embedded etcd of `beacon serve`), under
//
//	/_etcd/registry/<token>/_config/size           the cluster size N (decimal)
//	/_etcd/registry/<token>/members/<member-id>    one key per member
//
// A member registers "name=peerURL[,name=peerURL…]"
// (sorted pairs) under its member ID: the first 8 bytes, big-endian, of
// the SHA-1 of its sorted peer URLs followed by the token, in lower-case
// hex (MemberID). The first N registrations by create revision form the
// cluster; later members get "discovery: cluster is full". Every member
// derives the same --initial-cluster string, and etcd, started with it and
// with the token as --initial-cluster-token, computes the same member IDs.
// Keys, values, IDs, ordering and error messages are exactly etcd's
// (server/etcdserver/api/v3discovery, etcd 3.6 and later), so real etcd
// members and Beacon interoperate both ways. Beacon also claims the name
// (NameKey) in the transaction that registers, so that two Beacon members
// can never register one name or one peer-URL set; etcd ignores the claims.
//
// # Client
//
// Join registers a member and waits for the cluster to fill; GetCluster
// waits without registering and also answers for a full token (proxies
// use it). Beyond etcd's client they honour the context (give it a
// deadline), re-list after a watch failure or a compaction instead of
// hanging or spinning, notice a removed token or a deleted registration,
// refuse duplicate names and peer URLs before registering, report
// progress (k of N registered, retries) through WithProgress, and fail at
// once on bad credentials. Config mirrors etcd's --discovery-* flags and
// their defaults.
//
// # Tokens
//
// CreateToken writes a token's size key only if nothing exists under the
// token; TokenStatus reads its registrations in order (which are in, which
// came too late); RemoveToken deletes it. NewHandler serves the same over
// HTTP (POST /v1/tokens, GET and DELETE /v1/tokens/{token}) for `beacon
// serve`; `beacon token new|status|rm` is the command line.
//
// The discovery.etcd.io-compatible v2 protocol, for etcd 3.5 and older
// members, is in package bootstrap/v2.
package bootstrap
