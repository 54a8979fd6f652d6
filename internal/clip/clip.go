// Package clip shortens the input that messages quote, so that a huge key
// or value keeps an error readable.
package clip

import (
	"strconv"
	"unicode/utf8"
)

// String returns s when it is at most max bytes long; otherwise its first
// max bytes, less the start of a character cut in two, then "…(N bytes)"
// with s's length.
func String(s string, max int) string {
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut-- // not inside a character
	}
	return s[:cut] + "…(" + strconv.Itoa(len(s)) + " bytes)"
}
