package kube_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/beaconplane/beacon/internal/testkit/kubetest"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"
)

// manifest is one object of deploy/kubernetes.
type manifest struct {
	file string
	obj  *unstructured.Unstructured
}

func manifests(t *testing.T) []manifest {
	t.Helper()
	files, err := filepath.Glob("../../deploy/kubernetes/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	var out []manifest
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range strings.Split(string(b), "\n---\n") {
			u := &unstructured.Unstructured{}
			if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if len(u.Object) == 0 {
				continue
			}
			out = append(out, manifest{file: filepath.Base(f), obj: u})
		}
	}
	return out
}

// The shipped manifests are valid: each decodes strictly into its Go type
// (no unknown or misspelt field), and the real API server accepts each in
// a server-side dry run (its validation and defaulting).
func TestDeployManifests(t *testing.T) {
	cp := kubetest.Shared(t)
	ns := cp.Namespace(t)
	typed := map[string]any{
		"Service": &corev1.Service{}, "ServiceAccount": &corev1.ServiceAccount{},
		"Deployment": &appsv1.Deployment{}, "StatefulSet": &appsv1.StatefulSet{},
		"Role": &rbacv1.Role{}, "RoleBinding": &rbacv1.RoleBinding{},
		"ClusterRole": &rbacv1.ClusterRole{}, "ClusterRoleBinding": &rbacv1.ClusterRoleBinding{},
		"CustomResourceDefinition": &apiextensionsv1.CustomResourceDefinition{},
	}
	resources := map[string]string{
		"Service": "services", "ServiceAccount": "serviceaccounts", "Deployment": "deployments",
		"StatefulSet": "statefulsets", "Role": "roles", "RoleBinding": "rolebindings", "ClusterRole": "clusterroles",
		"ClusterRoleBinding": "clusterrolebindings", "CustomResourceDefinition": "customresourcedefinitions",
	}
	kinds := map[string]bool{}
	for _, m := range manifests(t) {
		kind := m.obj.GetKind()
		kinds[kind] = true
		target, ok := typed[kind]
		if !ok {
			t.Errorf("%s: kind %s is not checked", m.file, kind)
			continue
		}
		raw, _ := yaml.Marshal(m.obj.Object)
		if err := yaml.UnmarshalStrict(raw, target); err != nil {
			t.Errorf("%s: %s %s: %v", m.file, kind, m.obj.GetName(), err)
		}
		gv, _ := schema.ParseGroupVersion(m.obj.GetAPIVersion())
		gvr := gv.WithResource(resources[kind])
		var err error
		opts := metav1.ApplyOptions{FieldManager: "beacon-test", DryRun: []string{metav1.DryRunAll}, Force: true}
		switch kind {
		case "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition":
			_, err = cp.Dynamic.Resource(gvr).Apply(kubetest.Ctx(t), m.obj.GetName(), m.obj, opts)
		default:
			_, err = cp.Dynamic.Resource(gvr).Namespace(ns).Apply(kubetest.Ctx(t), m.obj.GetName(), m.obj, opts)
		}
		if err != nil {
			t.Errorf("%s: the API server refuses %s %s: %v", m.file, kind, m.obj.GetName(), err)
		}
	}
	for _, k := range []string{"CustomResourceDefinition", "Role", "Deployment", "StatefulSet"} {
		if !kinds[k] {
			t.Errorf("no %s in deploy/kubernetes", k)
		}
	}
}
