package registryapi

import (
	"bufio"
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry"
)

// TestSnapshotIsWrittenAsItsMessage: a snapshot written one instance at a
// time is, byte for byte, the event json.Marshal of a SnapshotMessage
// makes, for no instance, one, and several with metadata, a check and a
// health verdict.
func TestSnapshotIsWrittenAsItsMessage(t *testing.T) {
	at := time.Date(2026, 12, 4, 15, 0, 0, 0, time.UTC)
	a := beacon.Instance{Namespace: "ns", Component: "c", Endpoint: "e", ID: "0000000000000001", Address: "127.0.0.1:1", RegisteredAt: at}
	b := a
	b.ID, b.Metadata, b.Status = "0000000000000002", map[string]string{"zone": "a\"<b>", "w": "3"}, beacon.StatusDraining
	b.Check = &beacon.Check{Kind: beacon.CheckHTTP, Path: "/healthz", Interval: time.Second}
	b.Health = &beacon.Health{Status: beacon.HealthFailing, Reason: "503", Since: at}
	for _, ins := range [][]beacon.Instance{{}, {a}, {a, b, a}} {
		batch := registry.Batch{Kind: registry.Snapshot, Revision: 42}
		for _, in := range ins {
			batch.Events = append(batch.Events, beacon.Event{Type: beacon.Added, Instance: in})
		}
		var got bytes.Buffer
		w := bufio.NewWriter(&got)
		if err := writeBatch(w, batch); err != nil {
			t.Fatal(err)
		}
		_ = w.Flush()
		msg, err := json.Marshal(SnapshotMessage{Revision: 42, Instances: ins})
		if err != nil {
			t.Fatal(err)
		}
		if want := "event: snapshot\nid: 42\ndata: " + string(msg) + "\n\n"; got.String() != want {
			t.Fatalf("%d instances:\n got %q\nwant %q", len(ins), got.String(), want)
		}
	}
}

// TestSnapshotThatCannotBeEncodedEndsWithAnError: an instance json cannot
// encode ends the snapshot's data where it is, and an error event names it.
func TestSnapshotThatCannotBeEncodedEndsWithAnError(t *testing.T) {
	bad := beacon.Instance{Namespace: "ns", Component: "c", Endpoint: "e", ID: "00000000000000ff", RegisteredAt: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}
	batch := registry.Batch{Kind: registry.Snapshot, Revision: 7, Events: []beacon.Event{{Instance: bad}}}
	var got bytes.Buffer
	w := bufio.NewWriter(&got)
	if err := writeBatch(w, batch); err == nil {
		t.Fatal("no error for an instance that cannot be encoded")
	}
	_ = w.Flush()
	if !strings.HasSuffix(got.String(), "\n\n") || !strings.Contains(got.String(), "data: {\"revision\":7,\"instances\":[]}\n\nevent: error\n") ||
		!strings.Contains(got.String(), "00000000000000ff") {
		t.Fatalf("stream: %q", got.String())
	}
}
