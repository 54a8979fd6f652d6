//go:build !unix

package etcdtest

import "os"

// tryLock cannot lock across processes here; ports are still unique
// within the process.
func tryLock(*os.File) bool { return true }
