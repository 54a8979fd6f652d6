package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// The beacon command lines in deploy/kubernetes parse: every subcommand,
// flag and argument exists (with the Downward API's $(VAR)s given sample
// values), so the manifests cannot drift from the CLI.
func TestDeployManifestCommandLines(t *testing.T) {
	files, err := filepath.Glob("../../deploy/kubernetes/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	vars := regexp.MustCompile(`\$\((\w+)\)`)
	sample := map[string]string{"POD_NAME": "beacon-0", "POD_NAMESPACE": "demo", "POD_IP": "10.0.0.1"}
	checked := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range strings.Split(string(b), "\n---\n") {
			var obj struct {
				Spec struct {
					Template struct {
						Spec struct {
							Containers []struct {
								Name  string   `json:"name"`
								Image string   `json:"image"`
								Args  []string `json:"args"`
							} `json:"containers"`
						} `json:"spec"`
					} `json:"template"`
				} `json:"spec"`
			}
			if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			for _, c := range obj.Spec.Template.Spec.Containers {
				if !strings.HasPrefix(c.Image, "beacon:") {
					continue
				}
				args := make([]string, len(c.Args))
				for i, a := range c.Args {
					args[i] = vars.ReplaceAllStringFunc(a, func(m string) string {
						v, ok := sample[vars.FindStringSubmatch(m)[1]]
						if !ok {
							t.Errorf("%s: container %s: no sample value for %s", f, c.Name, m)
						}
						return v
					})
				}
				cmd, rest, err := rootCmd.Find(args)
				if err == nil {
					err = cmd.ParseFlags(rest)
				}
				if err == nil {
					err = cmd.ValidateArgs(cmd.Flags().Args())
				}
				if err != nil || cmd == rootCmd {
					t.Errorf("%s: container %s: beacon %s: %v", filepath.Base(f), c.Name, strings.Join(c.Args, " "), err)
				}
				checked++
			}
		}
	}
	if checked < 4 {
		t.Fatalf("checked %d command lines", checked)
	}
}
