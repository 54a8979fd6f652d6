package dynamo_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/dynamo"
)

func mustDecode(t *testing.T, key, value string) dynamo.Entry {
	t.Helper()
	e, err := dynamo.Decode(key, []byte(value))
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func card(t *testing.T, key, name string) dynamo.Entry {
	t.Helper()
	return mustDecode(t, key, strings.Replace(modelValue, "Qwen/Qwen3-0.6B", name, 1))
}

var ref42 = beacon.Ref{Namespace: "dynamo", Component: "backend", Endpoint: "generate", ID: "000000000000002a"}

// TestCatalogJoinsModelCards pins how cards are joined: every card under
// the instance's namespace, component, endpoint and ID (any suffix, padded
// or not), its display name sorted and once in MetaModels; a card without
// its instance is kept until the instance comes.
func TestCatalogJoinsModelCards(t *testing.T) {
	c := dynamo.NewCatalog[int]()
	if got := c.Put(card(t, "v1/mdc/dynamo/backend/generate/2a/lora-b", "lora-b"), 1); got != ref42 {
		t.Fatalf("Put card: ref %v", got)
	}
	if _, ok := c.Lookup(ref42); ok {
		t.Fatal("a card alone serves an instance")
	}
	c.Put(mustDecode(t, "v1/instances/dynamo/backend/generate/2a", tcpValue), 2)
	s, ok := c.Lookup(ref42)
	if !ok || s.Instance.Metadata[dynamo.MetaModels] != "lora-b" || s.Source != 2 || s.Key != "v1/instances/dynamo/backend/generate/2a" {
		t.Fatalf("Lookup = %+v, %v", s, ok)
	}
	c.Put(card(t, "v1/mdc/dynamo/backend/generate/2a", "Qwen/Qwen3-0.6B"), 3)
	c.Put(card(t, "v1/mdc/dynamo/backend/generate/002a", "Qwen/Qwen3-0.6B"), 4)                                                          // the same model again
	c.Put(mustDecode(t, "v1/mdc/dynamo/backend/generate/2b", strings.Replace(modelValue, `"instance_id":42`, `"instance_id":43`, 1)), 5) // another instance's
	s, _ = c.Lookup(ref42)
	if got := s.Instance.Metadata[dynamo.MetaModels]; got != "Qwen/Qwen3-0.6B,lora-b" || len(s.Models) != 3 {
		t.Fatalf("models %q, cards %+v", got, s.Models)
	}
	c.Delete("v1/mdc/dynamo/backend/generate/2a/lora-b")
	c.Delete("v1/mdc/dynamo/backend/generate/2a")
	s, _ = c.Lookup(ref42)
	if got := s.Instance.Metadata[dynamo.MetaModels]; got != "Qwen/Qwen3-0.6B" {
		t.Fatalf("after deleting cards: models %q", got)
	}
	c.Delete("v1/mdc/dynamo/backend/generate/002a")
	if s, _ = c.Lookup(ref42); s.Instance.Metadata[dynamo.MetaModels] != "" || len(c.Models(ref42)) != 0 {
		t.Fatalf("no card left, yet %+v", s)
	}
	// The catalog's own entries are never changed by a lookup.
	if e, src, ok := c.Get("v1/instances/dynamo/backend/generate/2a"); !ok || src != 2 || e.Instance.Metadata[dynamo.MetaModels] != "" {
		t.Fatalf("Get = %+v, %v, %v", e.Instance, src, ok)
	}
}

// TestCatalogRefusesCollisions pins that two instance entries of one ref
// (a padded and an unpadded ID) serve neither, and that the survivor
// serves again when one goes.
func TestCatalogRefusesCollisions(t *testing.T) {
	c := dynamo.NewCatalog[int]()
	unpadded := mustDecode(t, "v1/instances/dynamo/backend/generate/2a", tcpValue)
	padded := mustDecode(t, "v1/instances/dynamo/backend/generate/000000000000002a", strings.Replace(tcpValue, "10.0.0.5", "10.0.0.6", 1))
	c.Put(unpadded, 1)
	c.Put(padded, 2)
	if _, ok := c.Lookup(ref42); ok {
		t.Fatal("a colliding ref is served")
	}
	if got := c.Colliding(ref42); !slices.Equal(got, []string{padded.Key, unpadded.Key}) {
		t.Fatalf("Colliding = %v", got)
	}
	if got := c.Refs(); !slices.Equal(got, []beacon.Ref{ref42}) {
		t.Fatalf("Refs = %v", got)
	}
	if ref, ok := c.Delete(unpadded.Key); !ok || ref != ref42 {
		t.Fatalf("Delete = %v, %v", ref, ok)
	}
	s, ok := c.Lookup(ref42)
	if !ok || s.Instance.Address != "10.0.0.6:9999" || c.Colliding(ref42) != nil {
		t.Fatalf("after the collision ended: %+v, %v", s, ok)
	}
	if _, ok := c.Delete(unpadded.Key); ok {
		t.Fatal("deleted an absent key")
	}
	c.Delete(padded.Key)
	if len(c.Refs()) != 0 || len(c.Keys()) != 0 {
		t.Fatalf("empty catalog holds %v %v", c.Refs(), c.Keys())
	}
}

func TestCatalogPutReplaces(t *testing.T) {
	c := dynamo.NewCatalog[int]()
	c.Put(mustDecode(t, "v1/instances/dynamo/backend/generate/2a", tcpValue), 1)
	c.Put(mustDecode(t, "v1/instances/dynamo/backend/generate/2a", strings.Replace(tcpValue, "10.0.0.5", "10.0.0.9", 1)), 2)
	s, ok := c.Lookup(ref42)
	if !ok || s.Instance.Address != "10.0.0.9:9999" || s.Source != 2 || c.Colliding(ref42) != nil {
		t.Fatalf("Lookup = %+v, %v", s, ok)
	}
}
