package defaults

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
)

func base() beacon.Instance {
	return beacon.Instance{Namespace: "ns", Component: "c", Endpoint: "e", Address: "10.0.0.1:80"}
}

// Fill gives a new ID, status serving and a registration time now, in UTC
// to the millisecond; it leaves the caller's instance untouched.
func TestFillGivesDefaults(t *testing.T) {
	in := base()
	in.Metadata = map[string]string{"k": "v"}
	before := time.Now().UTC().Truncate(time.Millisecond)
	got, err := Fill(in, 4096)
	if err != nil {
		t.Fatal(err)
	}
	after := time.Now().UTC()
	if len(got.ID) != 16 || got.Status != beacon.StatusServing {
		t.Fatalf("ID %q, status %q: want 16 hex digits and serving", got.ID, got.Status)
	}
	if got.RegisteredAt.Location() != time.UTC || got.RegisteredAt.Before(before) || got.RegisteredAt.After(after) ||
		got.RegisteredAt.Nanosecond()%int(time.Millisecond) != 0 {
		t.Fatalf("RegisteredAt %v: want now, UTC, to the millisecond", got.RegisteredAt)
	}
	if in.ID != "" || in.Status != "" || !in.RegisteredAt.IsZero() {
		t.Fatalf("Fill changed its argument: %+v", in)
	}
}

// What the registrant set is kept (a registration time only moved to UTC).
func TestFillKeepsWhatIsSet(t *testing.T) {
	in := base()
	in.ID, in.Status = "00000000000000ab", beacon.StatusDraining
	at := time.Date(2026, 1, 2, 3, 4, 5, 123456789, time.FixedZone("x", 3600))
	in.RegisteredAt = at
	got, err := Fill(in, 4096)
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != in.ID || got.Status != beacon.StatusDraining || !got.RegisteredAt.Equal(at) || got.RegisteredAt.Location() != time.UTC {
		t.Fatalf("Fill(%+v) = %+v: want ID, status and time kept, the time in UTC", in, got)
	}
}

// An instance that does not validate (here, metadata over the limit) is
// refused with the validation's error and a zero instance.
func TestFillValidates(t *testing.T) {
	in := base()
	in.Metadata = map[string]string{"k": strings.Repeat("x", 100)}
	got, err := Fill(in, 10)
	if !errors.Is(err, beacon.ErrInvalid) {
		t.Fatalf("over the metadata limit: %v, want ErrInvalid", err)
	}
	if got.Namespace != "" {
		t.Fatalf("refused instance returned as %+v, want zero", got)
	}
	if _, err := Fill(in, 1000); err != nil {
		t.Fatalf("under the limit: %v", err)
	}
}
