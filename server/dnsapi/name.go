package dnsapi

import "strings"

// Names under the domain, relative to it and without trailing dot, read
// from the right (see doc.go for the scheme):
//
//	<namespace>                               namespace (empty non-terminal)
//	<component>.<namespace>                   every endpoint of a component
//	<endpoint>.<component>.<namespace>        one endpoint
//	_<endpoint>._tcp.<component>.<namespace>  RFC 2782 SRV form (also _udp)
//	<id>.<endpoint>.<component>.<namespace>   one instance
//
// A zone groups names by component: compKey is "<component>.<namespace>"
// and prefix is what stands before it ("" for the component itself).

// splitQName places a query name against the domain (canonical: lower
// case, trailing dot). It returns the name relative to the domain in lower
// case ("" for the apex) and whether the name is under the domain at all.
// A name holding a presentation-format escape (a label with a '\') is under
// the domain if its last labels are the domain's, and never names a record:
// rel then holds the backslash.
func splitQName(qname, domain string) (rel string, inDomain bool) {
	q := lowerASCII(qname)
	if q != "" && q[len(q)-1] != '.' {
		q += "."
	}
	if q == domain {
		return "", true
	}
	if len(q) <= len(domain) || !strings.HasSuffix(q, domain) || q[len(q)-len(domain)-1] != '.' {
		return "", false
	}
	rel = q[:len(q)-len(domain)-1]
	// The dot before the domain must be a label boundary, not an escaped
	// dot inside a label ("a\.beacon." is one label in the root zone):
	// count the backslashes before it.
	n := 0
	for i := len(rel) - 1; i >= 0 && rel[i] == '\\'; i-- {
		n++
	}
	if n%2 == 1 {
		return "", false
	}
	if hasEmptyLabel(rel) {
		return "", false // empty labels: not a name
	}
	return rel, true
}

// hasEmptyLabel reports whether a name in presentation format (without
// its trailing dot) has an empty label: it is empty, starts with a dot, or
// has two dots in a row that are not an escaped dot ("a\..b" is the label
// "a." and the label "b").
func hasEmptyLabel(name string) bool {
	atStart := true // at the start of a label
	for i := 0; i < len(name); i++ {
		switch name[i] {
		case '\\':
			atStart = false
			i++ // the escaped byte; a \DDD escape's digits are plain bytes
		case '.':
			if atStart {
				return true
			}
			atStart = true
		default:
			atStart = false
		}
	}
	return atStart
}

// splitRel splits a relative name into the namespace, the component key
// ("<component>.<namespace>", empty for a bare namespace) and the prefix
// before it.
func splitRel(rel string) (ns, compKey, prefix string) {
	i := strings.LastIndexByte(rel, '.')
	if i < 0 {
		return rel, "", ""
	}
	ns = rel[i+1:]
	j := strings.LastIndexByte(rel[:i], '.')
	if j < 0 {
		return ns, rel, ""
	}
	return ns, rel[j+1:], rel[:j]
}

// lowerASCII lower-cases A-Z only (DNS names compare case-insensitively in
// ASCII; other bytes arrive escaped). It allocates only when it must.
func lowerASCII(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; 'A' <= c && c <= 'Z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if c := b[j]; 'A' <= c && c <= 'Z' {
					b[j] = c + 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return s
}
