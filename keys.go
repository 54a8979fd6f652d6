package beacon

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// ServicesDir is the directory under a Keyspace's root that holds instances.
const ServicesDir = "/services/"

// OwnersDir is the directory under a Keyspace's root that holds the
// ownership records of registrations made on behalf of remote clients
// (Beacon's HTTP API): one record per lease, bound to it, under the
// registration's namespace. It is outside ServicesDir, so the registry
// never lists or watches it.
const OwnersDir = "/beacon-owners/"

// Ref names one instance: namespace/component/endpoint/id.
type Ref struct {
	Namespace string
	Component string
	Endpoint  string
	ID        string
}

// String renders the ref as namespace/component/endpoint/id.
func (r Ref) String() string {
	return r.Namespace + "/" + r.Component + "/" + r.Endpoint + "/" + r.ID
}

// Validate checks that the ref names an instance Beacon may serve: its
// names obey the read rules (ValidateReadNamespace, ValidateReadLabel),
// its ID is 16 hex digits. Beacon's writers obey stricter rules
// (Instance.Validate).
func (r Ref) Validate() error { return r.validate(validateReadName) }

// validate checks the names with check, then the ID.
func (r Ref) validate(check func(field, value string) error) error {
	if err := check("namespace", r.Namespace); err != nil {
		return err
	}
	if err := check("component", r.Component); err != nil {
		return err
	}
	if err := check("endpoint", r.Endpoint); err != nil {
		return err
	}
	return ValidateID(r.ID)
}

// ValidateWritten checks the ref against the rules of Beacon's writers
// (DNS labels, ValidateLabel): the refs Beacon's own key layout can hold.
func (r Ref) ValidateWritten() error { return r.validate(ValidateLabel) }

// Query selects instances by namespace, component and endpoint. An empty
// field matches everything below the fields before it; a field may only be
// set when every field before it is set.
type Query struct {
	Namespace string
	Component string
	Endpoint  string
}

// ParseQuery parses "", "ns", "ns/component" or "ns/component/endpoint",
// each name one Beacon may serve (Query.Validate).
func ParseQuery(s string) (Query, error) {
	if s == "" {
		return Query{}, nil
	}
	parts := strings.Split(s, "/")
	if len(parts) > 3 {
		return Query{}, fieldError(ErrInvalidName, "query", s, "must be namespace[/component[/endpoint]]")
	}
	var q Query
	fields := []*string{&q.Namespace, &q.Component, &q.Endpoint}
	for i, p := range parts {
		if p == "" {
			return Query{}, fieldError(ErrInvalidName, "query", s, "must be namespace[/component[/endpoint]] with no empty part")
		}
		*fields[i] = p
	}
	if err := q.Validate(); err != nil {
		return Query{}, err
	}
	return q, nil
}

// Validate checks that no field is set after an empty one and that each
// set field is a name Beacon may serve (the read rules:
// ValidateReadNamespace, ValidateReadLabel).
func (q Query) Validate() error { return q.validate(validateReadName) }

// ValidateWritten is Validate with the rules of Beacon's writers (DNS
// labels, ValidateLabel): the queries Beacon's own key layout can answer.
func (q Query) ValidateWritten() error { return q.validate(ValidateLabel) }

func (q Query) validate(check func(field, value string) error) error {
	fields := [...]struct{ name, value string }{
		{"namespace", q.Namespace}, {"component", q.Component}, {"endpoint", q.Endpoint},
	}
	empty := ""
	for _, f := range fields {
		if f.value == "" {
			if empty == "" {
				empty = f.name
			}
			continue
		}
		if empty != "" {
			return fieldError(ErrInvalidName, f.name, f.value, "may only be set together with "+empty)
		}
		if err := check(f.name, f.value); err != nil {
			return err
		}
	}
	return nil
}

// String renders the query as ns[/component[/endpoint]].
func (q Query) String() string {
	s := q.Namespace
	if q.Component != "" {
		s += "/" + q.Component
	}
	if q.Endpoint != "" {
		s += "/" + q.Endpoint
	}
	return s
}

// Matches reports whether the instance at ref is selected by the query.
func (q Query) Matches(r Ref) bool {
	return (q.Namespace == "" || q.Namespace == r.Namespace) &&
		(q.Component == "" || q.Component == r.Component) &&
		(q.Endpoint == "" || q.Endpoint == r.Endpoint)
}

// Keyspace maps refs to store keys and back:
//
//	{root}/services/{namespace}/{component}/{endpoint}/{instance_id}
//
// The zero Keyspace has an empty root, so keys start with "/services/".
type Keyspace struct {
	root string
}

// NewKeyspace returns the keyspace under root. Root is "" or a path that
// starts with "/" and does not end with one, e.g. "/beacon".
func NewKeyspace(root string) (Keyspace, error) {
	if root != "" && (!strings.HasPrefix(root, "/") || strings.HasSuffix(root, "/") || strings.Contains(root, "//")) {
		return Keyspace{}, fieldError(ErrInvalidKey, "root", root, `must be empty or a path like "/beacon": leading '/', no trailing '/'`)
	}
	if !utf8.ValidString(root) || strings.ContainsFunc(root, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) {
		return Keyspace{}, fieldError(ErrInvalidKey, "root", root, "must be printable UTF-8 without spaces or control characters")
	}
	return Keyspace{root: root}, nil
}

// Root returns the keyspace's root.
func (k Keyspace) Root() string { return k.root }

// Key returns the store key of the instance at r. It does not validate r.
func (k Keyspace) Key(r Ref) string {
	return k.root + ServicesDir + r.Namespace + "/" + r.Component + "/" + r.Endpoint + "/" + r.ID
}

// HealthSuffix ends the key of the checkers' verdict on an instance: the
// instance's key followed by "/health". A verdict lives beside its
// instance, so that a watch of any prefix sees both in one ordered stream.
const HealthSuffix = "/health"

// HealthKey returns the store key of the checkers' verdict on the instance
// at r. It does not validate r.
func (k Keyspace) HealthKey(r Ref) string { return k.Key(r) + HealthSuffix }

// ParseHealthKey returns the ref of the instance whose verdict is stored at
// key, and false if key is not a verdict's key.
func (k Keyspace) ParseHealthKey(key string) (Ref, bool) {
	ikey, ok := strings.CutSuffix(key, HealthSuffix)
	if !ok {
		return Ref{}, false
	}
	r, err := k.Parse(ikey)
	return r, err == nil
}

// Prefix returns the store prefix holding every instance selected by q. It
// always ends with "/", so namespace "a" never matches namespace "ab".
func (k Keyspace) Prefix(q Query) string {
	p := k.root + ServicesDir
	for _, f := range [...]string{q.Namespace, q.Component, q.Endpoint} {
		if f == "" {
			break
		}
		p += f + "/"
	}
	return p
}

// OwnersPrefix returns the store prefix of the ownership records of
// namespace ns (every namespace when ns is empty), e.g.
// "/beacon-owners/prod/". A role that may register in a namespace over
// the HTTP API needs write access to it as well as to Prefix.
func (k Keyspace) OwnersPrefix(ns string) string {
	if ns == "" {
		return k.root + OwnersDir
	}
	return k.root + OwnersDir + ns + "/"
}

// Parse returns the ref stored at key, or a *FieldError if key does not
// follow the layout.
func (k Keyspace) Parse(key string) (Ref, error) {
	const rule = "must be {root}/services/{namespace}/{component}/{endpoint}/{16-hex-digit id}"
	rest, ok := strings.CutPrefix(key, k.root+ServicesDir)
	if !ok {
		return Ref{}, fieldError(ErrInvalidKey, "key", key, rule+" with root "+quoteRoot(k.root))
	}
	parts := strings.Split(rest, "/")
	if len(parts) != 4 {
		return Ref{}, fieldError(ErrInvalidKey, "key", key, rule)
	}
	r := Ref{Namespace: parts[0], Component: parts[1], Endpoint: parts[2], ID: parts[3]}
	if err := r.ValidateWritten(); err != nil { // Beacon's layout holds what its writers wrote
		return Ref{}, err
	}
	return r, nil
}

func quoteRoot(root string) string {
	if root == "" {
		return `""`
	}
	return root
}

// ParseRef parses "namespace/component/endpoint/id", a ref Beacon may
// serve (Ref.Validate).
func ParseRef(s string) (Ref, error) {
	parts := strings.Split(s, "/")
	if len(parts) != 4 {
		return Ref{}, fieldError(ErrInvalidName, "instance", s, "must be namespace/component/endpoint/id")
	}
	r := Ref{Namespace: parts[0], Component: parts[1], Endpoint: parts[2], ID: parts[3]}
	if err := r.Validate(); err != nil {
		return Ref{}, err
	}
	return r, nil
}
