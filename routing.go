package beacon

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// The metadata keys Beacon's DNS (SRV records) and xDS read to route to
// an instance, so that one registration routes alike through either.
const (
	// MetaWeight is the instance's share of its service's (xDS: its
	// locality's) traffic, 0-65535; DefaultWeight when absent.
	MetaWeight = "weight"
	// MetaPriority orders instances into failover tiers, 0-65535, lower
	// first; DefaultPriority when absent.
	MetaPriority = "priority"
	// MetaLBPolicy chooses the service's load-balancing policy in xDS:
	// one of LBPolicies.
	MetaLBPolicy = "lb_policy"
)

// DefaultWeight and DefaultPriority stand for a weight or a priority an
// instance does not set, or sets to a value routing cannot read.
const (
	DefaultWeight   = 10
	DefaultPriority = 10
)

// LBPolicies are the values MetaLBPolicy may take, the default first.
var LBPolicies = []string{"round_robin", "ring_hash", "least_request"}

// Uint16Meta reads the metadata value of key as 0-65535 in decimal: def
// when the key is absent; ok is false when it is set to anything else
// (routing then uses def).
func Uint16Meta(md map[string]string, key string, def uint16) (v uint16, ok bool) {
	s, set := md[key]
	if !set {
		return def, true
	}
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil {
		return def, false
	}
	return uint16(n), true
}

// RoutingWarnings says, one sentence each, which of in's routing
// metadata values (MetaWeight, MetaPriority, MetaLBPolicy) DNS and xDS
// cannot read: they route the instance as if the key were absent. Metadata
// is free-form, so these are warnings to the one who registers, not
// refusals.
func (in Instance) RoutingWarnings() []string {
	var out []string
	for _, k := range []struct {
		key string
		def uint16
	}{{MetaWeight, DefaultWeight}, {MetaPriority, DefaultPriority}} {
		if _, ok := Uint16Meta(in.Metadata, k.key, k.def); !ok {
			out = append(out, fmt.Sprintf("metadata %s=%q is not 0-65535: DNS and xDS route this instance with %s %d", k.key, shorten(in.Metadata[k.key]), k.key, k.def))
		}
	}
	if p, set := in.Metadata[MetaLBPolicy]; set && !slices.Contains(LBPolicies, p) {
		out = append(out, fmt.Sprintf("metadata %s=%q is none of %s: xDS does not count it", MetaLBPolicy, shorten(p), strings.Join(LBPolicies, ", ")))
	}
	return out
}
