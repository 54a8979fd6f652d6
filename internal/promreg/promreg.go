// Package promreg registers Prometheus collectors so that several
// components sharing one Registerer (two registries in a process, two HTTP
// APIs on one server) share collectors instead of failing.
package promreg

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Register registers c with reg and returns it, or returns the collector of
// the same type reg already holds under the same description. Any other
// error is joined into *errp and c is returned, so that a constructor can
// register all its collectors and report every failure at once.
func Register[C prometheus.Collector](reg prometheus.Registerer, c C, errp *error) C {
	err := reg.Register(c)
	if err == nil {
		return c
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing
		}
	}
	*errp = errors.Join(*errp, err)
	return c
}
