package publish

import "fmt"

// CheckScheme returns an error saying what is wrong with a resolver
// scheme that gRPC would not accept in a target URL (RFC 3986: a
// lower-case letter, then lower-case letters, digits, '+', '-' or '.'),
// or nil.
func CheckScheme(s string) error {
	if !validScheme(s) {
		return fmt.Errorf("scheme %q must be lower-case letters, digits, '+', '-' or '.', starting with a letter", s)
	}
	return nil
}

func validScheme(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z':
		case i > 0 && ('0' <= c && c <= '9' || c == '+' || c == '-' || c == '.'):
		default:
			return false
		}
	}
	return true
}
