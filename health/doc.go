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
// application-level "I am fine", distinct from the lease.
// beacon.ParseCheck reads the command line's form of a check:
//
//	grpc | grpc:SERVICE | http:/PATH | tcp | ttl:DURATION
//
// and Check.Validate refuses timing that cannot work (intervals outside
// beacon.MinCheckInterval..MaxCheckInterval, a timeout longer than the
// interval, thresholds of 0), saying what to write instead.
//
// A Runner probes one address with one check and turns the results into a
// verdict with rise and fall thresholds:
//
//	            pass                   Fall failures in a row
//	Unknown ─────────────▶ Passing ─────────────────────────▶ Failing
//	   │                      ▲                                  │
//	   │ Fall failures        └──────────────────────────────────┘
//	   └──in a row──▶ Failing        Rise passes in a row
//
// Anything shorter than a threshold changes nothing, which damps an
// instance flapping faster than the thresholds. Unknown and Passing are
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
package health
