package registry_test

import (
	"errors"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry"
)

// TestGetByList: a Discoverer without Getter is read by listing the ref's
// endpoint, through registry.Get as through GetByList: the instance, not
// found for another ID, the name rule for a bad ref.
func TestGetByList(t *testing.T) {
	ctx := within(t, 10*time.Second)
	r := newRegistry(t, newMemoryStore(t), registry.Config{})
	reg, err := r.Register(ctx, inst("get", "10.0.0.1:80"))
	if err != nil {
		t.Fatal(err)
	}
	listOnly := struct{ registry.Discoverer }{r} // hides StoreRegistry.Get
	ref := reg.Instance().Ref()
	for name, get := range map[string]func(beacon.Ref) (beacon.Instance, error){
		"Get":       func(ref beacon.Ref) (beacon.Instance, error) { return registry.Get(ctx, listOnly, ref) },
		"GetByList": func(ref beacon.Ref) (beacon.Instance, error) { return registry.GetByList(ctx, r, ref) },
	} {
		if in, err := get(ref); err != nil || in.Address != "10.0.0.1:80" {
			t.Errorf("%s(%s) = %v, %v", name, ref, in, err)
		}
		other := ref
		other.ID = "000000000000002a"
		if _, err := get(other); !errors.Is(err, beacon.ErrNotFound) {
			t.Errorf("%s of an unknown ID: %v, want not found", name, err)
		}
		bad := ref
		bad.Namespace = "Not_A_Label"
		if _, err := get(bad); !errors.Is(err, beacon.ErrInvalidName) {
			t.Errorf("%s of an invalid ref: %v, want the name rule", name, err)
		}
	}
}
