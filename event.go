package beacon

import "fmt"

// EventType says what happened to an instance.
type EventType uint8

const (
	// Added: an instance appeared (also used for every instance of a
	// snapshot).
	Added EventType = iota + 1
	// Updated: an instance already seen changed (address, metadata,
	// status...).
	Updated
	// Removed: an instance went away (deregistered, drained, or its lease
	// expired).
	Removed
)

func (t EventType) String() string {
	switch t {
	case Added:
		return "added"
	case Updated:
		return "updated"
	case Removed:
		return "removed"
	}
	return "unknown"
}

// MarshalText renders the type as added, updated or removed.
func (t EventType) MarshalText() ([]byte, error) { return []byte(t.String()), nil }

// UnmarshalText parses added, updated or removed.
func (t *EventType) UnmarshalText(b []byte) error {
	for _, c := range []EventType{Added, Updated, Removed} {
		if string(b) == c.String() {
			*t = c
			return nil
		}
	}
	return fmt.Errorf("beacon: unknown event type %q: want added, updated or removed", b)
}

// Event is one change to the set of instances a watcher follows.
type Event struct {
	Type EventType `json:"type"`
	// Instance is the instance after the change; for Removed, the last
	// state the watcher saw.
	Instance Instance `json:"instance"`
	// Revision is the store revision of the change. Events that the
	// watcher derived by re-listing carry the revision of that listing.
	Revision int64 `json:"revision"`
}
