//go:build !unix

package freeport

import "os"

// tryLock cannot lock across processes here; ports are still unique
// within the process.
func tryLock(*os.File) bool { return true }
