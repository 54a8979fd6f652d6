package file

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"time"

	"github.com/beaconplane/beacon/store"
)

// On-disk formats. Every integer is little-endian.
//
// A log segment (wal/<first revision, 20 digits>.log) starts with the
// 8-byte segmentMagic, followed by records:
//
//	[u32 payload length][u32 CRC-32C of payload][payload]
//
// A payload is one of:
//
//	commit:  [u8 1][u64 revision][u32 n] n × event
//	compact: [u8 2][u64 watermark]
//	seal:    [u8 3][u64 first revision of the next segment]
//
// and an event is
//
//	[u8 type][u64 lease][u64 create revision][u32 key length][key][u32 value length][value]
//
// The snapshot file holds the state at one revision:
//
//	[8-byte snapshotMagic][u64 revision][u64 compact watermark][u32 n]
//	n × ([u32 key length][key][u32 value length][value][u64 create][u64 mod][u64 lease])
//	[u32 CRC-32C of everything before]
const (
	segmentMagic  = "BCNWAL01"
	snapshotMagic = "BCNSNP01"

	recCommit  = 1
	recCompact = 2
	recSeal    = 3

	recHeaderSize = 8
	// maxPayload bounds a record: a lease revoke may delete many keys,
	// each with a value of up to store.MaxValueSize.
	maxPayload = 1 << 30
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// record is one decoded log record.
type record struct {
	kind   uint8
	rev    int64 // commit: the new revision; compact: watermark; seal: next first revision
	events []store.Event
}

// errShort reports bytes that end inside a record (a write in progress, or
// a torn write left by a crash).
var errShort = errors.New("file: incomplete record")

// errChecksum reports a record whose checksum does not match.
var errChecksum = errors.New("file: record checksum mismatch")

// encodeRecord frames r for appending to a segment.
func encodeRecord(r record) []byte {
	var p []byte
	p = append(p, r.kind)
	p = binary.LittleEndian.AppendUint64(p, uint64(r.rev))
	if r.kind == recCommit {
		p = binary.LittleEndian.AppendUint32(p, uint32(len(r.events)))
		for _, e := range r.events {
			p = append(p, uint8(e.Type))
			p = binary.LittleEndian.AppendUint64(p, uint64(e.KV.Lease))
			p = binary.LittleEndian.AppendUint64(p, uint64(e.KV.CreateRevision))
			p = appendBytes(p, []byte(e.KV.Key))
			p = appendBytes(p, e.KV.Value)
		}
	}
	out := make([]byte, recHeaderSize, recHeaderSize+len(p))
	binary.LittleEndian.PutUint32(out[0:4], uint32(len(p)))
	binary.LittleEndian.PutUint32(out[4:8], crc32.Checksum(p, castagnoli))
	return append(out, p...)
}

func appendBytes(p, b []byte) []byte {
	p = binary.LittleEndian.AppendUint32(p, uint32(len(b)))
	return append(p, b...)
}

// recordSize reads the frame header at the start of b and returns the
// record's total size, or errShort if b does not hold the whole header.
func recordSize(b []byte) (int, error) {
	if len(b) < recHeaderSize {
		return 0, errShort
	}
	n := binary.LittleEndian.Uint32(b[0:4])
	if n == 0 || n > maxPayload {
		return 0, fmt.Errorf("%w: payload length %d", errChecksum, n)
	}
	return recHeaderSize + int(n), nil
}

// decodeRecord decodes one framed record from the start of b and returns
// it with its size. It never panics on arbitrary input.
func decodeRecord(b []byte) (record, int, error) {
	size, err := recordSize(b)
	if err != nil {
		return record{}, 0, err
	}
	if len(b) < size {
		return record{}, 0, errShort
	}
	p := b[recHeaderSize:size]
	if crc32.Checksum(p, castagnoli) != binary.LittleEndian.Uint32(b[4:8]) {
		return record{}, 0, errChecksum
	}
	r, err := decodePayload(p)
	if err != nil {
		return record{}, 0, err
	}
	return r, size, nil
}

type reader struct {
	b   []byte
	err error
}

func (r *reader) u8() uint8 {
	if r.err != nil || len(r.b) < 1 {
		r.fail()
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

func (r *reader) u32() uint32 {
	if r.err != nil || len(r.b) < 4 {
		r.fail()
		return 0
	}
	v := binary.LittleEndian.Uint32(r.b)
	r.b = r.b[4:]
	return v
}

func (r *reader) u64() uint64 {
	if r.err != nil || len(r.b) < 8 {
		r.fail()
		return 0
	}
	v := binary.LittleEndian.Uint64(r.b)
	r.b = r.b[8:]
	return v
}

func (r *reader) bytes() []byte {
	n := r.u32()
	if r.err != nil || uint64(len(r.b)) < uint64(n) {
		r.fail()
		return nil
	}
	v := bytes.Clone(r.b[:n])
	r.b = r.b[n:]
	return v
}

func (r *reader) fail() {
	if r.err == nil {
		r.err = errors.New("truncated")
	}
}

func decodePayload(p []byte) (record, error) {
	r := &reader{b: p}
	rec := record{kind: r.u8(), rev: int64(r.u64())}
	if r.err == nil && rec.rev <= 0 {
		return record{}, fmt.Errorf("file: malformed record: revision %d", rec.rev)
	}
	switch rec.kind {
	case recCompact, recSeal:
	case recCommit:
		n := r.u32()
		if r.err == nil && uint64(n) > uint64(len(r.b))/22 {
			return record{}, fmt.Errorf("file: malformed record: %d events in %d bytes", n, len(r.b))
		}
		rec.events = make([]store.Event, 0, n)
		for i := uint32(0); i < n && r.err == nil; i++ {
			typ := store.EventType(r.u8())
			lease := store.LeaseID(r.u64())
			create := int64(r.u64())
			key := r.bytes()
			val := r.bytes()
			if r.err != nil {
				break
			}
			if typ != store.EventPut && typ != store.EventDelete {
				return record{}, fmt.Errorf("file: malformed record: event type %d", typ)
			}
			if err := store.ValidateKey(string(key)); err != nil {
				return record{}, fmt.Errorf("file: malformed record: %w", err)
			}
			kv := store.KeyValue{Key: string(key), ModRevision: rec.rev}
			if typ == store.EventPut {
				if val == nil {
					val = []byte{}
				}
				kv.Value, kv.Lease, kv.CreateRevision = val, lease, create
				if create <= 0 || create > rec.rev {
					return record{}, fmt.Errorf("file: malformed record: create revision %d at revision %d", create, rec.rev)
				}
			}
			rec.events = append(rec.events, store.Event{Type: typ, KV: kv})
		}
	default:
		return record{}, fmt.Errorf("file: malformed record: unknown kind %d", rec.kind)
	}
	if r.err != nil {
		return record{}, fmt.Errorf("file: malformed record: %w", r.err)
	}
	if len(r.b) != 0 {
		return record{}, fmt.Errorf("file: malformed record: %d trailing bytes", len(r.b))
	}
	return rec, nil
}

// snapshot is the state at one revision.
type snapshot struct {
	rev     int64
	compact int64
	kvs     []store.KeyValue
}

func encodeSnapshot(s snapshot) []byte {
	p := []byte(snapshotMagic)
	p = binary.LittleEndian.AppendUint64(p, uint64(s.rev))
	p = binary.LittleEndian.AppendUint64(p, uint64(s.compact))
	p = binary.LittleEndian.AppendUint32(p, uint32(len(s.kvs)))
	for _, kv := range s.kvs {
		p = appendBytes(p, []byte(kv.Key))
		p = appendBytes(p, kv.Value)
		p = binary.LittleEndian.AppendUint64(p, uint64(kv.CreateRevision))
		p = binary.LittleEndian.AppendUint64(p, uint64(kv.ModRevision))
		p = binary.LittleEndian.AppendUint64(p, uint64(kv.Lease))
	}
	return binary.LittleEndian.AppendUint32(p, crc32.Checksum(p, castagnoli))
}

func decodeSnapshot(b []byte) (snapshot, error) {
	if len(b) < len(snapshotMagic)+4 || string(b[:len(snapshotMagic)]) != snapshotMagic {
		return snapshot{}, errors.New("not a Beacon snapshot (bad magic)")
	}
	body, sum := b[:len(b)-4], binary.LittleEndian.Uint32(b[len(b)-4:])
	if crc32.Checksum(body, castagnoli) != sum {
		return snapshot{}, errors.New("snapshot checksum mismatch")
	}
	r := &reader{b: body[len(snapshotMagic):]}
	s := snapshot{rev: int64(r.u64()), compact: int64(r.u64())}
	n := r.u32()
	if r.err == nil && (s.rev <= 0 || s.compact <= 0 || s.compact > s.rev+1 || uint64(n) > uint64(len(r.b))/32) {
		return snapshot{}, fmt.Errorf("malformed snapshot header (revision %d, compact %d, %d keys)", s.rev, s.compact, n)
	}
	last := ""
	for i := uint32(0); i < n && r.err == nil; i++ {
		kv := store.KeyValue{Key: string(r.bytes()), Value: r.bytes()}
		kv.CreateRevision, kv.ModRevision, kv.Lease = int64(r.u64()), int64(r.u64()), store.LeaseID(r.u64())
		if r.err != nil {
			break
		}
		if kv.Value == nil {
			kv.Value = []byte{}
		}
		if err := store.ValidateKey(kv.Key); err != nil || (i > 0 && kv.Key <= last) ||
			kv.CreateRevision <= 0 || kv.CreateRevision > kv.ModRevision || kv.ModRevision > s.rev {
			return snapshot{}, fmt.Errorf("malformed snapshot entry %d (%q)", i, kv.Key)
		}
		last = kv.Key
		s.kvs = append(s.kvs, kv)
	}
	if r.err != nil {
		return snapshot{}, fmt.Errorf("malformed snapshot: %w", r.err)
	}
	if len(r.b) != 0 {
		return snapshot{}, fmt.Errorf("malformed snapshot: %d trailing bytes", len(r.b))
	}
	return s, nil
}

// marker is the content of the format marker file that identifies a
// directory as a Beacon store.
type marker struct {
	Format  string    `json:"format"`
	Version int       `json:"version"`
	Created time.Time `json:"created"`
}

const (
	markerFormat  = "beacon-file-store"
	markerVersion = 1
)

func parseMarker(b []byte) (marker, error) {
	var m marker
	if err := json.Unmarshal(b, &m); err != nil {
		return marker{}, fmt.Errorf("unreadable format marker: %w", err)
	}
	if m.Format != markerFormat {
		return marker{}, fmt.Errorf("format marker names format %q, not %q", m.Format, markerFormat)
	}
	if m.Version != markerVersion {
		return marker{}, fmt.Errorf("store format version %d is not supported by this Beacon (it reads version %d)", m.Version, markerVersion)
	}
	return m, nil
}

// leaseInfo is the content of a lease file. The lease's deadline is the
// file's modification time plus TTL: KeepAlive only touches the file.
type leaseInfo struct {
	TTLMillis int64 `json:"ttl_ms"`
}

func parseLease(b []byte) (time.Duration, error) {
	var l leaseInfo
	if err := json.Unmarshal(b, &l); err != nil {
		return 0, fmt.Errorf("unreadable lease file: %w", err)
	}
	ttl := time.Duration(l.TTLMillis) * time.Millisecond
	if err := store.ValidateTTL(ttl); err != nil {
		return 0, err
	}
	return ttl, nil
}
