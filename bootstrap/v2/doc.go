// Package v2 is a discovery.etcd.io-compatible discovery service: the HTTP
// protocol etcd up to 3.5 (and 3.6, deprecated) uses with --discovery=<url>,
// served from any Beacon store.
//
// # Protocol
//
// /new?size=N creates a token and answers, in plain text, the discovery URL
// BaseURL/<32 hex digits>. Each etcd member started with that URL as
// --discovery speaks a subset of etcd's v2 keys API against it:
//
//	GET  <token>/_config/size                 the cluster size
//	GET  <token>                              the registrations (_config is hidden)
//	PUT  <token>/<member-id>?prevExist=false  register (412, errorCode 105, if it exists)
//	GET  <token>/<member-id>?wait=true&waitIndex=<createdIndex>
//	GET  <token>?wait=true&waitIndex=<X-Etcd-Index+1>&recursive=true
//
// Answers are etcd v2 JSON ({"action":…,"node":{"key":…,"value":…,
// "createdIndex":…,"modifiedIndex":…}}, errors {"errorCode":…,"message":…,
// "cause":…,"index":…}) with the X-Etcd-Index header, and node keys under
// /_etcd/registry/<token> as on an etcd serving discovery. A long poll
// that sees no change within Config.WaitTimeout is answered 200 with an
// empty body, which etcd's client takes as "poll again". Store failures
// are etcd's 500 "Raft Internal Error", which etcd's client retries with
// backoff.
//
// # Indexes
//
// v2 indexes are the store's revisions, unchanged: X-Etcd-Index is the
// revision of the snapshot a request read, createdIndex and modifiedIndex
// are a key's create and mod revisions, and waitIndex=N watches from
// revision N inclusive. So a listing followed by a wait from X-Etcd-Index+1
// misses nothing and sees nothing twice, and the wait etcd's client makes
// on its own key at its createdIndex finds its own write at once. Indexes
// jump when other data in the same store changes, which v2 clients accept.
// A waitIndex older than the store's history gives etcd's errorCode 401
// ("The event in requested index is outdated and cleared").
//
// # Tokens
//
// Tokens live under Config.Prefix ("/_beacon/discovery-v2/" by default),
// apart from the v3 registry (/_etcd/registry). A token expires
// Config.MaxAge after /new (7 days by default): it answers 404 from then
// on, and the collection loop, run every Config.GCInterval by the Service
// until Close, deletes it. A removed or expired token ends the long polls
// on it with 404, so members fail instead of waiting forever.
//
// Differences from discovery.etcd.io: prevExist=false is honoured (a
// duplicate member ID gets 412 with errorCode 105, as from etcd itself),
// the size is validated (1 to bootstrap.MaxSize), and parameters etcd's
// discovery client never sends (ttl, prevValue, dir, …) are refused with
// errorCode 209 instead of being ignored.
package v2
