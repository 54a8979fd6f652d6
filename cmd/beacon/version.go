package main

import (
	"encoding/json"
	"fmt"
	"io"
	"runtime/debug"
	"strconv"

	"github.com/spf13/cobra"
)

func init() {
	var output string
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the version of beacon, its VCS revision and the etcd it embeds",
		Long: `Print the module version of beacon, the VCS revision it was built from (with
its commit time, and "modified" when the work tree had uncommitted changes),
the Go version, and the versions of the etcd, gRPC and NATS modules it links.
-o json prints one JSON object. beacon --version prints the same text.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v := readVersion()
			switch output {
			case "json":
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(v)
			case "text":
				return v.writeText(cmd.OutOrStdout())
			}
			return usagef("-o %q: want text or json", output)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "text", "text or json")
	rootCmd.AddCommand(cmd)
}

// addVersionFlag gives the root command --version.
func addVersionFlag(root *cobra.Command) {
	v := readVersion()
	root.Version = v.Version
	root.SetVersionTemplate(v.text())
}

// versionInfo is what `beacon version -o json` prints.
type versionInfo struct {
	Version string `json:"version"`
	// Revision, Time and Modified describe the VCS checkout the binary
	// was built from; empty when the build had no VCS information
	// (go run, go test, or -buildvcs=false).
	Revision string `json:"vcs_revision,omitempty"`
	Time     string `json:"vcs_time,omitempty"`
	Modified *bool  `json:"vcs_modified,omitempty"`
	Go       string `json:"go"`
	// Deps are the versions of the key modules linked in.
	Deps map[string]string `json:"deps,omitempty"`
}

// keyDeps are the modules `beacon version` reports.
var keyDeps = []string{"go.etcd.io/etcd/server/v3", "go.etcd.io/etcd/client/v3", "google.golang.org/grpc", "github.com/nats-io/nats.go"}

// readVersion reads the build information.
func readVersion() versionInfo {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return versionInfo{Version: "unknown"}
	}
	return versionFrom(info)
}

func versionFrom(info *debug.BuildInfo) versionInfo {
	v := versionInfo{Version: info.Main.Version, Go: info.GoVersion}
	if v.Version == "" || v.Version == "(devel)" {
		v.Version = "devel"
	}
	for _, kv := range info.Settings {
		switch kv.Key {
		case "vcs.revision":
			v.Revision = kv.Value
		case "vcs.time":
			v.Time = kv.Value
		case "vcs.modified":
			if b, err := strconv.ParseBool(kv.Value); err == nil {
				v.Modified = &b
			}
		}
	}
	for _, dep := range info.Deps {
		for _, want := range keyDeps {
			if dep.Path == want {
				if v.Deps == nil {
					v.Deps = map[string]string{}
				}
				mod := dep
				if dep.Replace != nil {
					mod = dep.Replace
				}
				v.Deps[want] = mod.Version
			}
		}
	}
	return v
}

// text renders the version for people.
func (v versionInfo) text() string {
	s := "beacon " + v.Version
	if v.Revision != "" {
		rev := v.Revision
		if len(rev) > 12 {
			rev = rev[:12]
		}
		s += " (" + rev
		if v.Time != "" {
			s += ", " + v.Time
		}
		if v.Modified != nil && *v.Modified {
			s += ", modified"
		}
		s += ")"
	}
	s += "\n"
	if v.Revision != "" {
		s += fmt.Sprintf("  vcs revision: %s\n", v.Revision)
	} else {
		s += "  vcs revision: unknown (built without VCS information)\n"
	}
	if v.Go != "" {
		s += fmt.Sprintf("  go: %s\n", v.Go)
	}
	for _, d := range keyDeps {
		if ver, ok := v.Deps[d]; ok {
			s += fmt.Sprintf("  %s: %s\n", d, ver)
		}
	}
	return s
}

func (v versionInfo) writeText(w io.Writer) error {
	_, err := io.WriteString(w, v.text())
	return err
}
