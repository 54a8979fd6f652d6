// Package health checks whether an instance serves, apart from whether its
// process lives (which its lease already says).
//
// A beacon.Check, declared with the instance it checks, says how: the
// standard gRPC health service (grpc.health.v1, followed through its Watch
// stream, so that a change is seen when the server pushes it, and called
// with Check once per interval on the same connection, so that a hung
// server fails too; polled with Check alone where the server has no
// Watch), an HTTP GET whose answer must be 2xx (redirects are not
// followed), a TCP connect, or a TTL the service itself refreshes — an
// application-level "I am fine", distinct from the lease. Checks speak
// plaintext only (HTTP/1.1, and h2c for gRPC): a failure against a
// TLS-only server says that it seems to be one (errTLSOnly).
// beacon.ParseCheck reads the command line's form of a check:
//
//	grpc | grpc:SERVICE | http:/PATH | tcp | ttl:DURATION
//
// and Check.Validate refuses timing that cannot work (intervals outside
// beacon.MinCheckInterval..MaxCheckInterval, a timeout longer than the
// interval, thresholds of 0), saying what to write instead.
//
// A Runner probes one address with one check (a TTL check: judges its
// last report) and turns the results into a verdict with rise and fall
// thresholds (a TTL check: 1 and 1):
//
//	            pass                   Fall failures in a row
//	Unknown ─────────────▶ Passing ─────────────────────────▶ Failing
//	   │                      ▲                                  │
//	   │ Fall failures        └──────────────────────────────────┘
//	   └──in a row──▶ Failing        Rise passes in a row
//
// Anything shorter than a threshold changes nothing, which damps an
// instance flapping faster than the thresholds. The thresholds count
// intervals, not results: a result counts only when it comes at least
// 0.9 interval (the shortest jittered wait) after the last one counted,
// so that a status a gRPC server pushes and the Check just after it count
// once. Unknown and Passing are
// served: checks take instances out, they never hold a new one back
// (fail-open). Every wait is jittered, the first one anywhere within one
// interval, so that checks declared together (a fleet restarted at once)
// do not probe together.
//
// The gRPC checks are tested against the health servers of three
// implementations: grpc-go's, grpc-js's (Node, npm grpc-health-check) and
// gRPC C-core's (Python on Debian's python3-grpcio, serving as
// grpcio-health-checking's servicer does), the last two as child processes
// (testdata/node, testdata/python). Those two push every status their
// application sets to a Watch, a repeated one too; a repeat counts as no
// new result.
//
// # The Checker
//
// A Checker (run by `beacon serve`) runs the checks declared with the
// instances of a registry, from outside their processes, sharing them
// with the checkers of the other servers so that each instance is probed
// once per interval for the whole cluster:
//
//   - Membership. Each checker registers itself through its registry's
//     session as the instance beacon/health/checker/<id hash> (CheckerRef:
//     the first 16 hex digits of the SHA-256 of Config.ID), with its ID
//     in the metadata under "checker" (CheckerIDMetadata) and its HTTP
//     address (Config.Addr) as the address. A second live checker with
//     the same ID cannot register, and checks nothing until the first is
//     gone. The checkers registered there (CheckersQuery) are its peers.
//   - Sharing. Every instance that declares a check is owned by one
//     checker, chosen by rendezvous hashing of the instance's name and the
//     checkers' IDs: every checker computes the same owner from the same
//     registrations, and one that joins or leaves moves only the instances
//     it wins or held. The owner runs a Runner for it, at its address
//     (host:port; a URL-form address is probed at its host and port, 80
//     and 443 for http and https without one). A TTL check's report is the
//     key {instance key}/report (registry.ReportKey), read every
//     beacon.TTLReadInterval (a quarter TTL, at most 10 s) and when the
//     last report turns one TTL old: a report written since the last read
//     is a Report. A TTL check has no interval, rise or fall: it fails one
//     TTL after the last report it saw (before any: after the Runner
//     started) and passes at the next.
//   - Verdicts. At each change of verdict (never per probe) the owner
//     writes beacon.Health JSON — {"status", "reason" while failing,
//     "since", "checker"} — to its backend (sink.go): over a registry that
//     keeps verdicts itself (registry.VerdictKeeper: registry/kube, where
//     they live in the checker's pod's InstanceSet and count while that pod
//     is Ready, so that Config.Store is not needed and TTL checks are not
//     run), to its VerdictSink, and a verdict of this checker on an
//     instance another checker owns now is deleted once the new owner's
//     shows; otherwise at Keyspace.HealthKey, bound to a lease of its
//     own (Config.LeaseTTL, by default its registry's session TTL) kept
//     alive every TTL/3: a checker that dies takes its verdicts with it,
//     and the instances it checked are served again (fail-open). A lost
//     lease is granted again and every verdict written again. Each
//     instance has at most one write in flight, and 8 writes run at once
//     for all; the Runners' jitter spreads the first verdicts of a fleet
//     restarted at once. On a handover the old owner's verdict stays until
//     the new owner writes its own. The verdict of an instance that is
//     gone, or no longer declares a check, is deleted by the checker it
//     names, one lease TTL later (a registrant that lost its lease comes
//     back with the same ID), with compare-and-delete: a verdict another
//     checker wrote meanwhile stays. Close deregisters the checker (its
//     peers take its instances over at once) and revokes its lease.
//   - Self-outage (cutoff.go). A checker cut off from its instances sees
//     them all fail at their next probes, before their verdicts turn
//     Failing. When more than half of at least 3 instances it owns fail
//     for it (their latest result or verdict), it says so in its
//     registration (CheckerSuspectMetadata) and, if it has peers, it is
//     doubtful: it holds its failing verdicts (writes none; those written
//     stay). It concludes at its first verdict that turns Failing and at
//     every Config.PeerInterval (DefaultPeerInterval, 10 s), once it has
//     held for the longest check interval of the instances failing for it
//     (its peers see the same failures meanwhile), at most 30 s: an
//     unrelated slow check does not delay the others' verdicts. It is cut
//     off when its peers' failing shares (the
//     failing verdicts each wrote over the instances it owns, as the
//     registry's view joins them) are all below half and none is suspect;
//     otherwise the failures are the instances' (confirmed) and it writes
//     what it held. It is cut off too when it has peers and none answers a
//     TCP connect to its address (tried at every look). A checker
//     without peers cannot tell its outage from the instances', is never
//     cut off, and so holds nothing: it writes its verdicts as they turn.
//     Cut off, it warns once,
//     sets beacon_health_checker_cut_off to 1, withdraws its failing
//     verdicts (compare-and-delete) and writes no failing verdict until
//     few of its instances fail for it again; then it restarts the Runners
//     of those still failing for it (a failure seen meanwhile is not
//     trusted) and writes what they find. Its passing verdicts are written
//     all along.
//
// Its metrics, on Config.Metrics: beacon_health_probes_total{kind,result}
// (result pass or fail; the statuses a gRPC server pushes are results,
// not probes), beacon_health_probe_duration_seconds{kind},
// beacon_health_verdict_changes_total{status},
// beacon_health_owned_instances and beacon_health_checker_cut_off.
package health
