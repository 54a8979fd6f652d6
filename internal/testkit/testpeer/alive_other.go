//go:build !unix

package testpeer

// alive cannot tell where signals are missing: every directory is kept.
func alive(int) bool { return true }
