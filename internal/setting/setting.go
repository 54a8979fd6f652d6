// Package setting names a configuration setting in the messages a library
// makes while it runs: answers to clients, warnings, logs.
//
// A library names a setting by its configuration field ("Config.MaxStreams",
// "dnsapi.Config.Domain"), never by a command-line flag, because a Go
// program sets fields, not flags. A command that sets those fields from
// flags (cmd/beacon) gives the library a Namer that turns a field into the
// flag, so that an operator of the binary reads the flag to change. Errors
// a library returns are renamed by the command itself; a Namer is for text
// the command never sees.
package setting

// Namer returns how an operator sets field (a configuration field as the
// library names it, "Config.MaxStreams"). A nil Namer names the field.
type Namer func(field string) string

// Name returns field as n names it: the field itself when n is nil or
// returns "".
func (n Namer) Name(field string) string {
	if n == nil {
		return field
	}
	if s := n(field); s != "" {
		return s
	}
	return field
}

// Names returns each field as n names it, joined by " and ".
func (n Namer) Names(fields ...string) string {
	out := ""
	for i, f := range fields {
		if i > 0 {
			out += " and "
		}
		out += n.Name(f)
	}
	return out
}
