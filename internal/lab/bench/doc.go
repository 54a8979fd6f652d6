// Package bench holds the scenarios behind `beacon bench`. Every scenario
// measures Beacon and the equivalent raw etcd client code in the same run,
// against the same server, and reports both with their ratio, so that a
// figure never stands without its baseline.
package bench
