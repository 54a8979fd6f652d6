// Package registry is Beacon's service registry: processes register the
// instances they serve, callers list and watch them, and nothing goes
// silently wrong when the store has a bad minute.
//
// # Registering
//
// A StoreRegistry (New) works over any store.Store. It holds one session:
// one lease for all the instances the process registers, granted at the
// first Register and kept alive every TTL/3 by a goroutine that does
// nothing else (each attempt bounded by TTL/6, at most 2 s, and retried at
// once after a timeout, so a store server that hangs delays a renewal by
// one attempt, never past the lease's expiry). A lease is lost only when
// the store says it ended (it expired or was revoked): when no renewal was
// answered for a whole TTL the session reports it unconfirmed
// (ErrLeaseUnconfirmed) and goes on renewing it, because etcd may well
// still hold it (a new leader extends every lease). After a loss the
// session does not give up and does not exit the process: it retries with
// capped backoff, forever, gets a lease again and re-registers every
// instance with the same ID. Each transition (active, lost, recovered,
// closed) is delivered on States and counted in Prometheus metrics.
//
// Registration is create-if-absent: a second process claiming a live
// instance ID gets an error matching beacon.ErrAlreadyRegistered, never an
// overwrite, also when the session re-registers after a loss (the instance
// is then reported in StateChange.Conflicts and Registration.Err, and the
// session keeps trying to reclaim the ID).
//
//	reg, err := r.Register(ctx, beacon.Instance{Namespace: "prod", Component: "api",
//		Endpoint: "http", Address: "10.0.0.5:8080"})
//	...
//	err = reg.Update(ctx, func(in *beacon.Instance) { in.Address = "10.0.0.5:8081" })
//	...
//	err = reg.Drain(ctx, registry.DrainGrace(5*time.Second)) // draining, then removed
//
// # Discovering
//
// List returns a consistent snapshot and its revision. Watch returns a
// Watcher whose first Batch is the snapshot (possibly empty): the synced
// moment. Then come ordered Added, Updated and Removed events. After a
// reconnect or a compaction the watch re-lists and delivers the difference
// against what the consumer saw: no missed removal, no phantom removal, and a
// changed address under the same ID as Updated. Watchers of one prefix in
// one registry share one store watch; each consumer's events are coalesced
// from its own position, so a slow consumer never blocks the others and
// always converges to the latest state. Ending a watch (Close, or its
// context) never delivers removals or an empty list: Instances keeps the
// last view. FromRevision resumes a watch after a Batch.Revision. A watch
// never stays silently stale: when its store watch goes silent (a store
// server that hangs) or the store stops answering, watchers get a Stale
// batch, then a Resync. Removals that look like a fleet's leases lost at
// once rather than processes gone (a burst, or just after an outage) are
// held, each at most as long as its own registrant's lease TTL allows (the
// TTL its stored value declares, "lease_ttl_ms"; never the watcher's), and
// dropped if the instances come back; see Config.RemovalHold.
//
// Pickers (NewRoundRobin, NewRandom, NewP2C) choose an instance from a
// watcher's view for each call.
//
// # Health
//
// An instance may declare a health check (beacon.Instance.Check). The
// checkers' verdicts are stored beside the instances ({instance key}/health,
// beacon.Keyspace.HealthKey), each under its checker's lease, and List, Get
// and Watch join them: an instance with a check carries its verdict, or
// Health{Status: unknown} while there is none; one without a check carries
// no Health; what a stored value or a registrant says of health is
// ignored. A verdict's change is an Updated event of its instance at the
// verdict's revision; a verdict without its instance is kept aside until
// it appears. Panic is judged per priority level of a service (the
// instances of one beacon.MetaPriority): when more than
// Config.HealthPanicThreshold (default 0.5) of a level's checked instances
// are failing and no other level has an instance that takes work (where
// clients would go instead), the level is in panic: its failing instances carry
// Health.Panic and are served anyway (Instance.Serving). The failing
// instances of other levels are left out, so that clients fail over. Each
// level entering and leaving is logged once, naming its priority, and
// beacon_registry_health_panic_services counts the services with a level
// in panic. A TTL check is reported by the
// service itself (Report, ReportLeased: the TTLReporter capability) at
// {instance key}/report (ReportKey), under the instance's own lease; the
// view ignores reports.
//
// # Registrations owned by remote clients
//
// Servers that register instances on behalf of remote clients (the HTTP
// API) give each registration its own lease and a secret:
// RegisterWithTTL returns the Secret that Heartbeat, UpdateLeased and
// DeregisterLeased require (a wrong one answers as an unknown instance).
// They apply the same validation and uniqueness rules as Register. The
// lower-level GrantLease, RegisterLeased, KeepAliveLease and RevokeLease
// trust their in-process caller with lease IDs.
//
// # Operator actions
//
// An operator may drain or deregister any instance (Operator:
// DrainInstance keeps its lease, DeregisterInstance deletes its key), as
// the registry's store identity: Beacon's HTTP API uses a registry acting
// as the authenticated etcd user, so that etcd's roles decide. A session
// adopts an operator's drain instead of undoing it (StateChange.Drained),
// and writes back an instance an operator deregistered.
//
// # Layouts
//
// Config.Layout says what the registry reads. LayoutBeacon (the default)
// is Beacon's own keys, read and written. LayoutDynamo is a read-only view
// of what the NVIDIA Dynamo runtime writes: every feed watches Dynamo's
// root (v1/) through the same self-healing watch, decodes instances and
// model cards with package dynamo and keeps its query's entries in a
// dynamo.Catalog (dynview.go): a card is an update of its instance, two
// entries of one ID remove it, an entry Beacon cannot serve is reported
// once and skipped. Every write (Register, RegisterWithTTL, Heartbeat, the
// operator's drain...) is refused with ErrReadOnlyLayout. docs/dynamo.md
// describes it.
//
// docs/registry.md describes the key and value format, the watch
// guarantees and the metrics.
package registry
