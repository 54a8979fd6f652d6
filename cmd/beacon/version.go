package main

import (
	"fmt"
	"runtime/debug"

	"github.com/spf13/cobra"
)

func init() {
	rootCmd.AddCommand(&cobra.Command{
		Use:   "version",
		Short: "Print the version of beacon and of the etcd it embeds",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprint(cmd.OutOrStdout(), versionString())
			return nil
		},
	})
}

// versionString reports the module version, VCS revision and key
// dependencies from the build information.
func versionString() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "beacon (no build information)\n"
	}
	version := info.Main.Version
	if version == "" || version == "(devel)" {
		version = "devel"
	}
	s := fmt.Sprintf("beacon %s\n", version)
	for _, kv := range info.Settings {
		switch kv.Key {
		case "vcs.revision", "vcs.time", "vcs.modified":
			s += fmt.Sprintf("  %s: %s\n", kv.Key, kv.Value)
		}
	}
	s += fmt.Sprintf("  go: %s\n", info.GoVersion)
	for _, dep := range info.Deps {
		switch dep.Path {
		case "go.etcd.io/etcd/server/v3", "go.etcd.io/etcd/client/v3", "google.golang.org/grpc", "github.com/nats-io/nats.go":
			s += fmt.Sprintf("  %s: %s\n", dep.Path, dep.Version)
		}
	}
	return s
}
