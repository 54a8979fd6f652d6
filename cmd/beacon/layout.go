package main

import (
	"github.com/beaconplane/beacon/backend"
	"github.com/beaconplane/beacon/registry"
	"github.com/spf13/cobra"
)

// layoutHelp explains --layout in the help of the commands that take it.
const layoutHelp = `Layout (--layout, else BEACON_LAYOUT): beacon (default) reads and writes Beacon's
keys (<root>/services/...); dynamo is a read-only view of what the NVIDIA Dynamo
runtime writes to its etcd (v1/instances/..., with the model names of
v1/mdc/...): lists and watches work, every write is refused (docs/dynamo.md).`

// addLayoutFlag declares --layout on cmd.
func addLayoutFlag(cmd *cobra.Command) {
	cmd.Flags().String("layout", string(registry.LayoutBeacon),
		"what the registry reads: beacon (Beacon's keys) or dynamo (a read-only view of the Dynamo runtime's v1/instances; env "+registry.LayoutEnv+")")
	_ = cmd.RegisterFlagCompletionFunc("layout", cobra.FixedCompletions(
		[]string{string(registry.LayoutBeacon), string(registry.LayoutDynamo)}, cobra.ShellCompDirectiveNoFileComp))
}

// resolveLayout returns the layout --layout or BEACON_LAYOUT chooses for
// a registry of the backend named be, naming the flag or the variable
// when it is wrong.
func resolveLayout(cmd *cobra.Command, be string) (registry.Layout, error) {
	s := lookup(cmd.Flags(), "layout", registry.LayoutEnv)
	l, err := registry.ParseLayout(s.val)
	if err != nil {
		return "", usagef("%v: want %s or %s", s, registry.LayoutBeacon, registry.LayoutDynamo)
	}
	if l == registry.LayoutDynamo && be != backend.Kubernetes && (backend.Config{Name: be}).IsRegistry() {
		return "", usagef("%v: the %s backend has no Dynamo registrations to read: "+
			"point Beacon at the etcd (--backend etcd --endpoints ...) or the Kubernetes cluster (--backend kubernetes) of a Dynamo deployment (docs/dynamo.md)", s, be)
	}
	return l, nil
}
