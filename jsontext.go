package beacon

import (
	"fmt"
	"unicode/utf8"
)

// ValidateJSONText checks that data, a JSON document, holds only text that
// decodes without loss: valid UTF-8, and no \u escape of a lone UTF-16
// surrogate. encoding/json silently replaces both with U+FFFD, so a decoded
// value cannot tell that its input was damaged; metadata and names must be
// refused instead of rewritten. It does not otherwise check the syntax.
func ValidateJSONText(data []byte) error {
	if !utf8.Valid(data) {
		i := firstInvalidUTF8(data)
		return fieldError(ErrInvalid, "JSON text", fmt.Sprintf("byte %d (0x%02x)", i, data[i]),
			"must be valid UTF-8: encode the bytes (base64, hex) or send them as text")
	}
	inString := false
	for i := 0; i < len(data); i++ {
		c := data[i]
		if !inString {
			if c == '"' {
				inString = true
			}
			continue
		}
		switch c {
		case '"':
			inString = false
		case '\\':
			if i+1 >= len(data) {
				return nil // truncated: the JSON decoder reports it
			}
			i++
			if data[i] != 'u' {
				continue
			}
			r, ok := hex4(data, i+1)
			if !ok {
				continue // malformed: the JSON decoder reports it
			}
			i += 4
			switch {
			case r >= 0xDC00 && r <= 0xDFFF:
				return loneSurrogate(r)
			case r >= 0xD800 && r <= 0xDBFF:
				// A high surrogate must be followed by \u and a low one.
				if i+2 >= len(data) || data[i+1] != '\\' || data[i+2] != 'u' {
					return loneSurrogate(r)
				}
				low, ok := hex4(data, i+3)
				if !ok || low < 0xDC00 || low > 0xDFFF {
					return loneSurrogate(r)
				}
				i += 6
			}
		}
	}
	return nil
}

func loneSurrogate(r rune) error {
	return fieldError(ErrInvalid, "JSON text", fmt.Sprintf(`\u%04x`, r),
		"is a lone UTF-16 surrogate, which is not a character: send valid UTF-8 text")
}

// hex4 reads four hex digits at data[i:].
func hex4(data []byte, i int) (rune, bool) {
	if i+4 > len(data) {
		return 0, false
	}
	var r rune
	for _, c := range data[i : i+4] {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c-'a') + 10
		case c >= 'A' && c <= 'F':
			r |= rune(c-'A') + 10
		default:
			return 0, false
		}
	}
	return r, true
}

func firstInvalidUTF8(b []byte) int {
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n <= 1 {
			return i
		}
		i += n
	}
	return 0
}
