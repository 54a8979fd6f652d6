package file

import (
	"bytes"
	"errors"
	"testing"

	"github.com/beaconplane/beacon/store"
)

func sampleRecord() record {
	return record{kind: recCommit, rev: 7, events: []store.Event{
		{Type: store.EventPut, KV: store.KeyValue{Key: "/a", Value: []byte("v"), CreateRevision: 3, ModRevision: 7, Lease: 9}},
		{Type: store.EventDelete, KV: store.KeyValue{Key: "/b", ModRevision: 7}},
	}}
}

func FuzzDecodeRecord(f *testing.F) {
	f.Add(encodeRecord(sampleRecord()))
	f.Add(encodeRecord(record{kind: recCompact, rev: 5}))
	f.Add(encodeRecord(record{kind: recSeal, rev: 9}))
	f.Add([]byte{})
	f.Add([]byte{8, 0, 0, 0, 0, 0, 0, 0, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		rec, n, err := decodeRecord(b)
		if err != nil {
			return
		}
		// A record that decodes re-encodes to the same bytes.
		if again := encodeRecord(rec); !bytes.Equal(again, b[:n]) {
			t.Fatalf("re-encoding %x gave %x", b[:n], again)
		}
	})
}

func FuzzDecodeSnapshot(f *testing.F) {
	f.Add(encodeSnapshot(snapshot{rev: 9, compact: 4, kvs: []store.KeyValue{
		{Key: "/a", Value: []byte("1"), CreateRevision: 2, ModRevision: 3},
		{Key: "/b", Value: []byte{}, CreateRevision: 4, ModRevision: 9, Lease: 5},
	}}))
	f.Add(encodeSnapshot(snapshot{rev: 1, compact: 1}))
	f.Add([]byte(snapshotMagic))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := decodeSnapshot(b)
		if err != nil {
			return
		}
		if again := encodeSnapshot(s); !bytes.Equal(again, b) {
			t.Fatalf("re-encoding a snapshot changed it")
		}
	})
}

func FuzzParseMarker(f *testing.F) {
	f.Add([]byte(`{"format":"beacon-file-store","version":1,"created":"2026-01-01T00:00:00Z"}`))
	f.Add([]byte(`{"format":"other","version":1}`))
	f.Add([]byte(`not json`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := parseMarker(b)
		if err == nil && (m.Format != markerFormat || m.Version != markerVersion) {
			t.Fatalf("accepted marker %+v", m)
		}
	})
}

func FuzzParseLease(f *testing.F) {
	f.Add([]byte(`{"ttl_ms":10000}`))
	f.Add([]byte(`{"ttl_ms":-1}`))
	f.Add([]byte(`{`))
	f.Fuzz(func(t *testing.T, b []byte) {
		ttl, err := parseLease(b)
		if err == nil && store.ValidateTTL(ttl) != nil {
			t.Fatalf("accepted TTL %v", ttl)
		}
	})
}

func TestRecordRoundTrip(t *testing.T) {
	in := sampleRecord()
	b := encodeRecord(in)
	out, n, err := decodeRecord(append(b, 0xff))
	if err != nil || n != len(b) || len(out.events) != 2 || out.events[0].KV.Lease != 9 || out.events[1].Type != store.EventDelete {
		t.Fatalf("round trip: %+v, %d, %v", out, n, err)
	}
	if _, _, err := decodeRecord(b[:len(b)-1]); !errors.Is(err, errShort) {
		t.Fatalf("truncated record: %v", err)
	}
}
