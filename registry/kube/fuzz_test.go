package kube

import (
	"encoding/json"
	"testing"

	"github.com/beaconplane/beacon"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// FuzzDecodeSet feeds arbitrary JSON objects to the InstanceSet parser
// readers apply to every object they see: it never panics, and whatever it
// accepts is made of valid, unique instances owned by a pod.
func FuzzDecodeSet(f *testing.F) {
	f.Add(`{"metadata":{"name":"w","namespace":"n","uid":"s","ownerReferences":[{"apiVersion":"v1","kind":"Pod","name":"w","uid":"p"}]},` +
		`"spec":{"pod":{"name":"w","uid":"p"},"holder":"h","instances":[{"namespace":"a","component":"b","endpoint":"c",` +
		`"id":"00000000000000aa","address":"10.0.0.1:80","transport":"http","status":"serving","registered_at":"2026-01-01T00:00:00Z"}]}}`)
	f.Add(`{"metadata":{"ownerReferences":[{"apiVersion":"v1","kind":"Pod","uid":"p"}]},"spec":{"pod":{"uid":"p"},"instances":null}}`)
	f.Add(`{"spec":{"instances":[{}]}}`)
	f.Add(`{"metadata":{"ownerReferences":[{"apiVersion":"v1","kind":"Pod","uid":"p"}]},"spec":{"pod":{"uid":"p"},"instances":[1,"x",{"id":7}]}}`)
	f.Add(`{"spec":"garbage"}`)
	f.Fuzz(func(t *testing.T, doc string) {
		var obj map[string]any
		if json.Unmarshal([]byte(doc), &obj) != nil {
			return
		}
		u := &unstructured.Unstructured{Object: obj}
		s, err := func() (s *setInfo, err error) {
			defer func() {
				// Accessors of unstructured panic on nothing; a panic is a bug.
				if p := recover(); p != nil {
					t.Fatalf("decodeSet panicked on %s: %v", doc, p)
				}
			}()
			return decodeSet(u, beacon.DefaultMaxMetadataSize)
		}()
		if err != nil {
			return
		}
		if s.podUID == "" {
			t.Fatalf("accepted a set without a pod owner: %s", doc)
		}
		seen := map[beacon.Ref]bool{}
		for _, in := range s.instances {
			if err := in.Validate(); err != nil {
				t.Fatalf("accepted an invalid instance %+v: %v", in, err)
			}
			if seen[in.Ref()] {
				t.Fatalf("accepted %s twice", in.Ref())
			}
			seen[in.Ref()] = true
		}
	})
}
