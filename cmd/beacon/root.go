package main

import (
	"github.com/spf13/cobra"
)

// rootCmd is the beacon command. Each subcommand lives in its own file and
// adds itself from an init function.
var rootCmd = &cobra.Command{
	Use:   "beacon",
	Short: "Beacon: a discovery plane for distributed systems",
	Long: `Beacon lets the components of a distributed system find each other: a service
registry with leases and watches, etcd-compatible cluster bootstrap, gRPC naming,
an etcd proxy, and a server that runs it all on embedded etcd.

Flags override environment variables; each command's --help lists both. A
flag given an empty value (--flag= or --flag "", an unset shell variable) is
refused, unless its help says what empty means; an empty variable counts as
unset.
Exit status: 0 success, 1 failure, 2 bad usage (unknown command or flag, bad
value of a flag or variable).`,
	SilenceUsage:      true,
	SilenceErrors:     true,
	PersistentPreRunE: preRun, // logging.go
}

func init() {
	addLogFlags(rootCmd)    // logging.go
	addVersionFlag(rootCmd) // version.go
}
