package server

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A root password file that others may read is warned about, naming the
// fix; one only its owner may read, or none, is not.
func TestPasswordFileWarning(t *testing.T) {
	dir := t.TempDir()
	for mode, warned := range map[os.FileMode]bool{0o600: false, 0o400: false, 0o640: true, 0o644: true, 0o606: true} {
		p := filepath.Join(dir, "pw")
		if err := os.WriteFile(p, []byte("s3cret\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		w := passwordFileWarning(p, "--auth-root-password-file")
		if (w != "") != warned || (warned && (!strings.Contains(w, "chmod 600") || !strings.Contains(w, p) || !strings.Contains(w, "--auth-root-password-file"))) {
			t.Errorf("mode %04o: warning %q, want one: %v", mode, w, warned)
		}
	}
	if w := passwordFileWarning("", "--auth-root-password-file"); w != "" {
		t.Errorf("no file: %q", w)
	}
}
