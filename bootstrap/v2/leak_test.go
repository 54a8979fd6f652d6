package v2_test

import (
	"net/http"
	"net/http/httptest"

	"go.uber.org/goleak"
)

func leakOptions() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
	}
}

// newHTTPServer serves h on a loopback port until the test ends.
func newHTTPServer(t interface {
	Cleanup(func())
}, h http.Handler) *httptest.Server {
	s := httptest.NewServer(h)
	t.Cleanup(s.Close)
	return s
}
