package kube_test

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/testkit/kubetest"
	"github.com/beaconplane/beacon/registry/kube"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "rewrite deploy/kubernetes/crd.yaml from kube.CRD()")

const crdPath = "../../deploy/kubernetes/crd.yaml"

const crdHeader = `# The InstanceSet custom resource definition of Beacon's Kubernetes-native
# registry (registry/kube). Generated from kube.CRD() by
#   go test ./registry/kube -run TestCRDYAML -update
# and checked against it by that test: do not edit by hand.
#
#   kubectl apply -f deploy/kubernetes/crd.yaml
`

// crdYAML renders kube.CRD() as deploy/kubernetes/crd.yaml holds it.
func crdYAML(t *testing.T) []byte {
	t.Helper()
	b, err := yaml.Marshal(kube.CRD())
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := yaml.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	delete(m, "status")
	delete(m["metadata"].(map[string]any), "creationTimestamp")
	out, err := yaml.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return append([]byte(crdHeader), out...)
}

// TestCRDYAML checks that the shipped CRD is kube.CRD(), so that the YAML
// users apply and the definition the tests install cannot drift.
func TestCRDYAML(t *testing.T) {
	want := crdYAML(t)
	if *update {
		if err := os.WriteFile(crdPath, want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(crdPath)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s differs from kube.CRD(); regenerate it with: go test ./registry/kube -run TestCRDYAML -update", crdPath)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(got[len(crdHeader):], &crd); err != nil {
		t.Fatalf("%s: %v", crdPath, err)
	}
	if crd.Name != kube.CRDName {
		t.Fatalf("CRD name %q", crd.Name)
	}
}

// TestCRDMatchesGoTypes checks the schema against the Go types both ways:
// every JSON field of InstanceSetSpec and beacon.Instance has a property of
// the matching type, and every property is a field.
func TestCRDMatchesGoTypes(t *testing.T) {
	schema := kube.CRD().Spec.Versions[0].Schema.OpenAPIV3Schema
	spec := schema.Properties["spec"]
	compare(t, "spec", reflect.TypeFor[kube.InstanceSetSpec](), spec)
	if !slices.Contains(schema.Required, "spec") {
		t.Error("spec is not required")
	}
}

// notOnKubernetes are the fields the InstanceSet has no place for: an
// instance's health and a verdict's panic are the readers' to join and
// decide, never stored on any backend.
var notOnKubernetes = map[string]bool{"spec.instances[].health": true, "spec.verdicts{}.panic": true}

func compare(t *testing.T, path string, typ reflect.Type, p apiextensionsv1.JSONSchemaProps) {
	t.Helper()
	if typ == reflect.TypeFor[time.Duration]() {
		if p.Type != "string" {
			t.Errorf("%s: a duration is a string such as \"10s\" (beacon.Check's JSON), schema says %s", path, p.Type)
		}
		return
	}
	switch typ.Kind() {
	case reflect.Pointer:
		compare(t, path, typ.Elem(), p)
	case reflect.Struct:
		if typ == reflect.TypeFor[time.Time]() {
			if p.Type != "string" || p.Format != "date-time" {
				t.Errorf("%s: a time is a date-time string, schema says %s/%s", path, p.Type, p.Format)
			}
			return
		}
		if p.Type != "object" {
			t.Errorf("%s: Go struct, schema type %q", path, p.Type)
			return
		}
		fields := map[string]reflect.Type{}
		for f := range typ.Fields() {
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "" || name == "-" {
				continue
			}
			fields[name] = f.Type
		}
		for name, ft := range fields {
			sp, ok := p.Properties[name]
			if !ok && notOnKubernetes[path+"."+name] {
				continue
			}
			if !ok {
				t.Errorf("%s.%s: Go field without a schema property", path, name)
				continue
			}
			compare(t, path+"."+name, ft, sp)
		}
		for name := range p.Properties {
			if _, ok := fields[name]; !ok {
				t.Errorf("%s.%s: schema property without a Go field", path, name)
			}
		}
		for _, r := range p.Required {
			if _, ok := fields[r]; !ok {
				t.Errorf("%s: required %q is no Go field", path, r)
			}
		}
	case reflect.Slice:
		if p.Type != "array" || p.Items == nil || p.Items.Schema == nil {
			t.Errorf("%s: Go slice, schema type %q", path, p.Type)
			return
		}
		compare(t, path+"[]", typ.Elem(), *p.Items.Schema)
	case reflect.Map:
		if p.Type != "object" || p.AdditionalProperties == nil || p.AdditionalProperties.Schema == nil {
			t.Errorf("%s: Go map, schema %q without additionalProperties", path, p.Type)
			return
		}
		compare(t, path+"{}", typ.Elem(), *p.AdditionalProperties.Schema)
	case reflect.String:
		if p.Type != "string" {
			t.Errorf("%s: Go string, schema type %q", path, p.Type)
		}
	case reflect.Int, reflect.Int64, reflect.Int32:
		if p.Type != "integer" {
			t.Errorf("%s: Go integer, schema type %q", path, p.Type)
		}
	default:
		t.Errorf("%s: Go %v not handled by the check", path, typ)
	}
}

var _ = filepath.Join
var _ beacon.Instance

// The schema and Beacon's own validation agree at their edges, on the real
// API server (server-side dry run): every instance Beacon accepts, at the
// limits of each field, is accepted; what the schema is there to refuse
// (and Beacon refuses too) is refused.
func TestCRDAgreesWithValidation(t *testing.T) {
	cp := kubetest.Shared(t)
	ns := cp.Namespace(t)
	pod := cp.Pod(t, ns, "schema")
	sets := cp.Dynamic.Resource(kube.GVR).Namespace(ns)
	base := beacon.Instance{Namespace: "demo", Component: "api", Endpoint: "http", ID: "00000000000000a1",
		Address: "10.0.0.1:80", Status: beacon.StatusServing, RegisteredAt: time.Date(2026, 1, 2, 3, 4, 5, 6e6, time.UTC)}
	label63 := strings.Repeat("a", 62) + "9"
	bigMeta := map[string]string{"k": strings.Repeat("é", (beacon.DefaultMaxMetadataSize-1)/2)}
	url1024 := "nats://10.0.0.1:4222/" + strings.Repeat("x", 1024-len("nats://10.0.0.1:4222/"))
	accepted := map[string]func(*beacon.Instance){
		"labels of 63":          func(in *beacon.Instance) { in.Namespace, in.Component, in.Endpoint = label63, label63, label63 },
		"address of 1024 bytes": func(in *beacon.Instance) { in.Address = url1024 }, // a URL: so long a host name is no DNS name
		"URL address":           func(in *beacon.Instance) { in.Address = "nats://10.0.0.1:4222/subject?x=1" },
		"IPv6 address":          func(in *beacon.Instance) { in.Address = "[2001:db8::1]:443" },
		"transport of 32":       func(in *beacon.Instance) { in.Transport = strings.Repeat("a", 28) + ".b+-" },
		"metadata at the limit": func(in *beacon.Instance) { in.Metadata = bigMeta },
		"unicode metadata key":  func(in *beacon.Instance) { in.Metadata = map[string]string{"zone/ü:1": "", "x": "two words, ü"} },
		"draining":              func(in *beacon.Instance) { in.Status = beacon.StatusDraining },
		"year 1":                func(in *beacon.Instance) { in.RegisteredAt = time.Date(1, 1, 1, 0, 0, 0, 1e6, time.UTC) },
		"year 9999":             func(in *beacon.Instance) { in.RegisteredAt = time.Date(9999, 12, 31, 23, 59, 59, 999e6, time.UTC) },
		"ID ffff…":              func(in *beacon.Instance) { in.ID = "ffffffffffffffff" },
		"gRPC check": func(in *beacon.Instance) {
			in.Check = &beacon.Check{Kind: beacon.CheckGRPC, Service: "pkg.Svc", Interval: 2 * time.Second,
				Timeout: time.Second, Rise: 1, Fall: beacon.MaxCheckThreshold}
		},
		"HTTP check path of 1024": func(in *beacon.Instance) {
			in.Check = &beacon.Check{Kind: beacon.CheckHTTP, Path: "/" + strings.Repeat("p", beacon.MaxCheckPathBytes-1)}
		},
		"TCP check": func(in *beacon.Instance) { in.Check = &beacon.Check{Kind: beacon.CheckTCP} },
	}
	for name, mutate := range accepted {
		in := base.Clone()
		mutate(&in)
		if err := in.Validate(); err != nil {
			t.Fatalf("%s: not valid in Go: %v", name, err)
		}
		if _, err := sets.Apply(kubetest.Ctx(t), pod.Name, setObject(pod, in), dryRun()); err != nil {
			t.Errorf("%s: valid in Go, refused by the schema: %v", name, err)
		}
	}
	refused := map[string]func(*beacon.Instance){
		"label of 64":          func(in *beacon.Instance) { in.Component = label63 + "a" },
		"label with a dot":     func(in *beacon.Instance) { in.Endpoint = "a.b" },
		"ID of 15":             func(in *beacon.Instance) { in.ID = "000000000000001" },
		"upper-case ID":        func(in *beacon.Instance) { in.ID = "00000000000000A1" },
		"address of 1025":      func(in *beacon.Instance) { in.Address = strings.Repeat("x", 1022) + ":80" },
		"upper-case transport": func(in *beacon.Instance) { in.Transport = "GRPC" },
		"transport of 33":      func(in *beacon.Instance) { in.Transport = strings.Repeat("a", 33) },
		"status up":            func(in *beacon.Instance) { in.Status = "up" },
		"check kind udp":       func(in *beacon.Instance) { in.Check = &beacon.Check{Kind: "udp"} },
		"HTTP check path of 1025": func(in *beacon.Instance) {
			in.Check = &beacon.Check{Kind: beacon.CheckHTTP, Path: "/" + strings.Repeat("p", beacon.MaxCheckPathBytes)}
		},
	}
	for name, mutate := range refused {
		in := base.Clone()
		mutate(&in)
		if err := in.Validate(); err == nil {
			t.Fatalf("%s: valid in Go", name)
		}
		if _, err := sets.Apply(kubetest.Ctx(t), pod.Name, setObject(pod, in), dryRun()); !apierrors.IsInvalid(err) {
			t.Errorf("%s: invalid in Go, the schema took it: %v", name, err)
		}
	}
}

func dryRun() metav1.ApplyOptions {
	return metav1.ApplyOptions{FieldManager: "schema-test", Force: true, DryRun: []string{metav1.DryRunAll}}
}
