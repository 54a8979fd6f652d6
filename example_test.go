package beacon_test

import (
	"fmt"

	"github.com/beaconplane/beacon"
)

func ExampleKeyspace() {
	ks, err := beacon.NewKeyspace("/beacon")
	if err != nil {
		panic(err)
	}
	key := ks.Key(beacon.Ref{Namespace: "prod", Component: "vllm", Endpoint: "generate", ID: "3f2a9c0d11e4b5a7"})
	fmt.Println(key)
	fmt.Println(ks.Prefix(beacon.Query{Namespace: "prod", Component: "vllm"}))

	ref, err := ks.Parse(key)
	fmt.Println(ref, err)
	// Output:
	// /beacon/services/prod/vllm/generate/3f2a9c0d11e4b5a7
	// /beacon/services/prod/vllm/
	// prod/vllm/generate/3f2a9c0d11e4b5a7 <nil>
}

func ExampleValidateLabel() {
	err := beacon.ValidateLabel("namespace", "Prod")
	fmt.Println(err)
	// Output:
	// beacon: invalid namespace "Prod": must be a DNS label: 1-63 lower-case letters, digits or '-', starting and ending with a letter or digit
}

func ExampleParseCheck() {
	c, err := beacon.ParseCheck("http:/healthz")
	if err != nil {
		panic(err)
	}
	c = c.WithDefaults()
	fmt.Println(c.Kind, c.Path, c.Interval, c.Timeout, c.Rise, c.Fall)

	_, err = beacon.ParseCheck("http:healthz")
	fmt.Println(err)
	// Output:
	// http /healthz 10s 2s 2 3
	// beacon: invalid check "http:healthz": the HTTP path must start with / and be a printable UTF-8 request path of at most 1024 bytes, with no space or fragment
}
