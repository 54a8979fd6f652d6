package health_test

import (
	"fmt"

	"github.com/beaconplane/beacon/health"
)

func ExampleParse() {
	c, err := health.Parse("http:/healthz")
	if err != nil {
		panic(err)
	}
	c = c.WithDefaults()
	fmt.Println(c.Kind, c.Path, c.Interval, c.Timeout, c.Rise, c.Fall)

	_, err = health.Parse("http:healthz")
	fmt.Println(err)
	// Output:
	// http /healthz 10s 2s 2 3
	// health: invalid check "http:healthz": the HTTP path must start with / and be a printable request path of at most 1024 bytes, with no space or fragment
}
