package etcdtest

import "github.com/beaconplane/beacon/internal/lab/freeport"

// FreePort returns a loopback TCP port that is free now and that no other
// caller, in this process or another on the machine, has been given (see
// internal/lab/freeport).
func FreePort() (int, error) { return freeport.Port() }
