package proxy

import (
	"errors"
	"strings"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/protobuf/proto"
)

func FuzzParseMode(f *testing.F) {
	for _, s := range []string{"", "readwrite", "readonly", "READONLY", " readonly ", "rw", "read-only"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParseMode(s)
		if err != nil {
			if !errors.Is(err, ErrBadMode) {
				t.Fatalf("ParseMode(%q) error %v does not wrap ErrBadMode", s, err)
			}
			return
		}
		if m != ReadWrite && m != ReadOnly {
			t.Fatalf("ParseMode(%q) = %q", s, m)
		}
	})
}

func FuzzConfigValidate(f *testing.F) {
	f.Add("readonly", "a=http://127.0.0.1:2380,b=http://127.0.0.2:2380", "", "", "", "")
	f.Add("", "", "http://127.0.0.1:2380", "", "", "")
	f.Add("", "", "", "https://discovery.etcd.io/3e86b59982e49066c5d813af1c2e2579", "", "")
	f.Add("", "", "", "", "example.com", "127.0.0.1:53")
	f.Add("x", "=", "://", "http://", "a/b", ":")
	f.Fuzz(func(t *testing.T, mode, initial, peer, durl, srv, dnsServer string) {
		c := Config{Mode: Mode(mode), InitialCluster: initial, DiscoveryURL: durl, DiscoverySRV: srv, DNSServer: dnsServer}
		if peer != "" {
			c.PeerURLs = strings.Split(peer, ",")
		}
		err := c.Validate()
		if err == nil {
			return
		}
		for _, s := range []error{ErrBadMode, ErrConflictingDiscovery, ErrInvalidConfig, ErrBadURL} {
			if errors.Is(err, s) {
				return
			}
		}
		t.Fatalf("Validate error %v wraps no proxy sentinel", err)
	})
}

func FuzzMemberURL(f *testing.F) {
	for _, s := range []string{"http://127.0.0.1:2379", "https://[::1]:2380/", "127.0.0.1:2379", "http://host", "http://h:1/p", "unix://x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		u, err := parseMemberURL(s)
		if err != nil {
			if !errors.Is(err, ErrBadURL) {
				t.Fatalf("error %v does not wrap ErrBadURL", err)
			}
			return
		}
		if (u.Scheme != "http" && u.Scheme != "https") || u.Port() == "" || u.Path != "" {
			t.Fatalf("parseMemberURL(%q) accepted %v", s, u)
		}
	})
}

// FuzzRequestClassification: the readonly checks never panic on any bytes,
// and agree with the decoded request.
func FuzzRequestClassification(f *testing.F) {
	put := &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte("k")}}}
	get := &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: []byte("k")}}}
	for _, r := range []*pb.TxnRequest{
		{}, {Success: []*pb.RequestOp{get}}, {Failure: []*pb.RequestOp{put}},
		{Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestTxn{RequestTxn: &pb.TxnRequest{Success: []*pb.RequestOp{put}}}}}},
	} {
		b, _ := proto.Marshal(r)
		f.Add(b)
	}
	b, _ := proto.Marshal(&pb.AlarmRequest{Action: pb.AlarmRequest_DEACTIVATE})
	f.Add(b)
	f.Add([]byte{0xff, 0x01})
	f.Fuzz(func(t *testing.T, b []byte) {
		w := txnWrites(b)
		var r pb.TxnRequest
		if err := proto.Unmarshal(b, &r); err == nil && w != txnHasWrite(&r) {
			t.Fatalf("txnWrites = %v, decoded request says %v", w, txnHasWrite(&r))
		} else if err != nil && !w {
			t.Fatal("an undecodable Txn must count as a write")
		}
		_ = alarmWrites(b)
	})
}
