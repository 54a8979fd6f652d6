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
