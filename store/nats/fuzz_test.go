package nats

import (
	"math"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

func FuzzConfigValidate(f *testing.F) {
	f.Add("nats://127.0.0.1:4222", "beacon", 1, 64)
	f.Add("tls://a:1,nats://b:2", "b_1-x", 3, 8)
	f.Add("localhost", "a.b", 0, 0)
	f.Fuzz(func(t *testing.T, url, bucket string, replicas, history int) {
		c := Config{URL: url, Bucket: bucket, Replicas: replicas, History: history, MarkerTTL: time.Second}
		if c.Validate() != nil {
			return
		}
		d := c.withDefaults()
		if !bucketRe.MatchString(d.Bucket) || d.Replicas < 1 || d.Replicas > 5 || d.History < MinHistory || d.History > 64 {
			t.Fatalf("Validate accepted %+v", c)
		}
	})
}

// FuzzDecodeMessage feeds arbitrary headers of a direct-get response to the
// decoders: they never panic, a response without subject or sequence is an
// error, and a decoded key has sane revisions (a transaction's revision is
// never before its message's sequence).
func FuzzDecodeMessage(f *testing.F) {
	f.Add("$KV.beacon.k.a", "17", "", "", "", "", []byte("v"))
	f.Add("$KV.beacon.k.a", "40", "12", "1f", "3", "2", []byte(nil))
	f.Add("", "x", "-1", "zz", "1", "9", []byte{})
	f.Fuzz(func(t *testing.T, subject, seq, create, lease, batchSize, batchSeq string, data []byte) {
		m := nats.NewMsg("reply")
		m.Data = data
		for k, v := range map[string]string{"Nats-Subject": subject, "Nats-Sequence": seq, hdrCreate: create,
			hdrLease: lease, hdrBatchSize: batchSize, hdrBatchSeq: batchSeq} {
			if v != "" {
				m.Header.Set(k, v)
			}
		}
		r, err := parseRaw(m)
		if err != nil {
			return
		}
		if subject == "" {
			t.Fatalf("parseRaw accepted a response without a subject")
		}
		if r.seq > math.MaxInt64/2 {
			return // beyond any stream's sequences
		}
		kv := decodeKV("/k", &r)
		if kv.ModRevision < int64(r.seq) || kv.CreateRevision <= 0 || kv.Lease < 0 || kv.Value == nil {
			t.Fatalf("decodeKV(seq %d, headers %v) = %+v", r.seq, m.Header, kv)
		}
	})
}
