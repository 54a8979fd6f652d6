package registry

import (
	"bytes"
	"encoding/json"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/store"
)

// The stored value carries, besides the instance, the TTL of the lease
// its registrant keeps it alive with ("lease_ttl_ms", whole
// milliseconds, last member of the object): what the registrant promised
// about how soon its death shows. Watchers bound how long they may hold
// back the instance's removal by it (hold.go), whatever their own
// settings. beacon.UnmarshalInstance ignores the member.
const (
	ttlName   = "lease_ttl_ms"
	ttlMember = `"` + ttlName + `":`
)

// appendTTL adds the lease_ttl_ms member to the JSON object val (which
// ends with '}'); a ttl outside [store.MinLeaseTTL, store.MaxLeaseTTL]
// (0: unknown) adds nothing.
func appendTTL(val []byte, ttl time.Duration) []byte {
	if ttl < store.MinLeaseTTL || ttl > store.MaxLeaseTTL || len(val) == 0 || val[len(val)-1] != '}' {
		return val
	}
	val = append(val[:len(val)-1], ',')
	val = append(val, ttlMember...)
	val = strconv.AppendInt(val, ttl.Milliseconds(), 10)
	return append(val, '}')
}

// storedTTL returns the lease TTL a stored value declares, or 0 if it
// declares none, or one outside [store.MinLeaseTTL, store.MaxLeaseTTL].
// val must be a valid JSON object (one beacon.UnmarshalInstance took).
// The member as Beacon writes it, last, is read without a second parse:
// in a valid object, `,"lease_ttl_ms":<digits>}` at the very end can
// only be a member of the object itself.
func storedTTL(val []byte) time.Duration {
	if !bytes.Contains(val, []byte(`"`+ttlName+`"`)) {
		return 0
	}
	ms, ok := int64(-1), false
	if body, found := bytes.CutSuffix(val, []byte("}")); found {
		if i := bytes.LastIndex(body, []byte(","+ttlMember)); i >= 0 {
			n, err := strconv.ParseInt(string(body[i+1+len(ttlMember):]), 10, 64)
			ms, ok = n, err == nil && n >= 0
		}
	}
	if !ok {
		// The member exactly so named (a struct field would also take
		// other cases of it).
		var obj map[string]json.RawMessage
		if json.Unmarshal(val, &obj) != nil || obj[ttlName] == nil || json.Unmarshal(obj[ttlName], &ms) != nil {
			return 0
		}
	}
	if ms > store.MaxLeaseTTL.Milliseconds() {
		return 0
	}
	if ttl := time.Duration(ms) * time.Millisecond; ttl >= store.MinLeaseTTL {
		return ttl
	}
	return 0
}

// appendInstance appends in's stored form, byte for byte what
// in.MarshalJSON gives, without reflection: encoding/json took about a
// sixth of the CPU a batched registration costs the client. It reports
// false, having appended nothing, for anything it does not write the way
// encoding/json does (a string that needs escaping, a time outside years
// 0-9999 or not in UTC); the caller then uses MarshalJSON.
func appendInstance(b []byte, in beacon.Instance) ([]byte, bool) {
	status := string(in.Status)
	if status == "" {
		status = string(beacon.StatusServing)
	}
	if in.Check != nil || in.Health != nil {
		return b, false // rare: MarshalJSON writes them
	}
	if !plain(in.Namespace) || !plain(in.Component) || !plain(in.Endpoint) || !plain(in.ID) ||
		!plain(in.Address) || !plain(in.Transport) || !plain(status) {
		return b, false
	}
	for k, v := range in.Metadata {
		if !plain(k) || !plain(v) {
			return b, false
		}
	}
	t := in.RegisteredAt
	if t.Location() != time.UTC || t.Year() < 0 || t.Year() > 9999 {
		return b, false
	}
	b = append(b, `{"namespace":"`...)
	b = append(b, in.Namespace...)
	b = append(b, `","component":"`...)
	b = append(b, in.Component...)
	b = append(b, `","endpoint":"`...)
	b = append(b, in.Endpoint...)
	b = append(b, `","id":"`...)
	b = append(b, in.ID...)
	b = append(b, `","address":"`...)
	b = append(b, in.Address...)
	b = append(b, `","transport":"`...)
	b = append(b, in.Transport...)
	b = append(b, '"')
	if len(in.Metadata) > 0 {
		b = append(b, `,"metadata":{`...)
		var buf [8]string
		keys := buf[:0]
		for k := range in.Metadata {
			keys = append(keys, k)
		}
		slices.Sort(keys) // encoding/json sorts map keys
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, '"')
			b = append(b, k...)
			b = append(b, `":"`...)
			b = append(b, in.Metadata[k]...)
			b = append(b, '"')
		}
		b = append(b, '}')
	}
	b = append(b, `,"status":"`...)
	b = append(b, status...)
	b = append(b, `","registered_at":"`...)
	b = t.AppendFormat(b, time.RFC3339Nano)
	b = append(b, `"}`...)
	return b, true
}

// plain reports whether encoding/json writes s as it is between quotes:
// printable ASCII other than the characters it escapes (", \ and, for
// HTML, <, > and &).
func plain(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c >= utf8.RuneSelf || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}
