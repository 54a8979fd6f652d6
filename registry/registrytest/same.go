package registrytest

import (
	"slices"

	"github.com/beaconplane/beacon"
)

// Same reports whether a and b are the same instance in every field. It is
// the tests' own comparison, written apart from beacon.Instance.Equal so
// that a defect there cannot hide from the tests that use it: strings
// compare as they are (an empty status is not "serving"), times by the
// instant (not the zone), and metadata by its sorted key=value pairs (no
// metadata and empty metadata are the same).
func Same(a, b beacon.Instance) bool {
	return a.Namespace == b.Namespace && a.Component == b.Component && a.Endpoint == b.Endpoint &&
		a.ID == b.ID && a.Address == b.Address && a.Transport == b.Transport && a.Status == b.Status &&
		a.RegisteredAt.UnixNano() == b.RegisteredAt.UnixNano() &&
		a.RegisteredAt.IsZero() == b.RegisteredAt.IsZero() &&
		slices.Equal(pairs(a.Metadata), pairs(b.Metadata))
}

func pairs(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"\x00"+v)
	}
	slices.Sort(out)
	return out
}
