package etcdnaming_test

import (
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/beaconplane/beacon/naming/etcdnaming"
)

func TestEncodeIsEtcdFormat(t *testing.T) {
	for _, tc := range []struct {
		ep   etcdnaming.Endpoint
		want string
	}{
		{etcdnaming.Endpoint{Addr: "1.2.3.4:50051"}, `{"Op":0,"Addr":"1.2.3.4:50051","Metadata":null}`},
		{etcdnaming.Endpoint{Addr: "127.0.0.1", Metadata: "metadata"}, `{"Op":0,"Addr":"127.0.0.1","Metadata":"metadata"}`},
		{etcdnaming.Endpoint{Addr: "h:1", Metadata: map[string]any{"zone": "a", "w": 3}}, `{"Op":0,"Addr":"h:1","Metadata":{"w":3,"zone":"a"}}`},
	} {
		got, err := etcdnaming.Encode(tc.ep)
		if err != nil || string(got) != tc.want {
			t.Errorf("Encode(%+v) = %s, %v; want %s", tc.ep, got, err, tc.want)
		}
	}
	for _, bad := range []etcdnaming.Endpoint{
		{},
		{Addr: "h:1", Metadata: func() {}},
		{Addr: "h:1", Metadata: make(chan int)},
		{Addr: "h:1", Metadata: math.NaN()},
	} {
		if _, err := etcdnaming.Encode(bad); !errors.Is(err, etcdnaming.ErrInvalidEndpoint) {
			t.Errorf("Encode(%+v) = %v; want ErrInvalidEndpoint", bad, err)
		}
	}
}

func TestDecode(t *testing.T) {
	for _, tc := range []struct {
		value  string
		want   etcdnaming.Endpoint
		errHas string
	}{
		{`{"Op":0,"Addr":"1.2.3.4:50051","Metadata":null}`, etcdnaming.Endpoint{Addr: "1.2.3.4:50051"}, ""},
		{`{"Addr":"1.2.3.4"}`, etcdnaming.Endpoint{Addr: "1.2.3.4"}, ""}, // etcd's docs write this
		{`{"addr":"a:1","metadata":{"zone":"b","n":[1,true]}}`,
			etcdnaming.Endpoint{Addr: "a:1", Metadata: map[string]any{"zone": "b", "n": []any{1.0, true}}}, ""},
		{`{"Op":1,"Addr":"a:1"}`, etcdnaming.Endpoint{Addr: "a:1"}, ""}, // Op is ignored, as by etcd
		{`{"Addr":"a:1","Extra":1}`, etcdnaming.Endpoint{Addr: "a:1"}, ""},
		{`not json`, etcdnaming.Endpoint{}, "invalid character"},
		{``, etcdnaming.Endpoint{}, "unexpected end"},
		{`null`, etcdnaming.Endpoint{}, "no Addr"},
		{`{}`, etcdnaming.Endpoint{}, "no Addr"},
		{`{"Metadata":{"m":1}}`, etcdnaming.Endpoint{}, "no Addr"},
		{`["a:1"]`, etcdnaming.Endpoint{}, "cannot unmarshal array"},
		{`"a:1"`, etcdnaming.Endpoint{}, "cannot unmarshal string"},
		{`{"Addr":"a:1"} trailing`, etcdnaming.Endpoint{}, "invalid character"},
		{`{"Op":"add","Addr":"a:1"}`, etcdnaming.Endpoint{}, "cannot unmarshal string"},
		{`{"Addr":7}`, etcdnaming.Endpoint{}, "cannot unmarshal number"},
	} {
		got, err := etcdnaming.Decode([]byte(tc.value))
		if tc.errHas == "" {
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Decode(%s) = %+v, %v; want %+v", tc.value, got, err, tc.want)
			}
			continue
		}
		if !errors.Is(err, etcdnaming.ErrInvalidValue) || !strings.Contains(err.Error(), tc.errHas) {
			t.Errorf("Decode(%s) error = %v; want ErrInvalidValue containing %q", tc.value, err, tc.errHas)
		}
	}
}

func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`{"Op":0,"Addr":"1.2.3.4:50051","Metadata":null}`, `{"Addr":"a:1","Metadata":{"zone":"a"}}`,
		`{"addr":"a:1","metadata":[1,2,{"x":null}]}`, `null`, `{}`, `[]`, `not json`, `{"Op":300}`,
		`{"Addr":"a:1","Metadata":1e400}`, "{\"Addr\":\"\xff\"}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, value []byte) {
		ep, err := etcdnaming.Decode(value)
		if err != nil {
			if !errors.Is(err, etcdnaming.ErrInvalidValue) {
				t.Fatalf("Decode(%q) error %v does not match ErrInvalidValue", value, err)
			}
			return
		}
		if ep.Addr == "" {
			t.Fatalf("Decode(%q) accepted an endpoint without Addr", value)
		}
		// What was read can be written back and reads the same.
		again, err := etcdnaming.Encode(ep)
		if err != nil {
			t.Fatalf("Encode(Decode(%q)): %v", value, err)
		}
		ep2, err := etcdnaming.Decode(again)
		if err != nil || ep2.Addr != ep.Addr {
			t.Fatalf("round trip of %q: %+v, %v", value, ep2, err)
		}
		a, _ := json.Marshal(ep.Metadata)
		b, _ := json.Marshal(ep2.Metadata)
		if string(a) != string(b) {
			t.Fatalf("metadata of %q changed in a round trip: %s vs %s", value, a, b)
		}
	})
}
