package publish

import "testing"

// CheckScheme accepts exactly RFC 3986 schemes in lower case: a letter,
// then letters, digits, '+', '-' or '.'.
func TestCheckScheme(t *testing.T) {
	for s, ok := range map[string]bool{
		"beacon": true, "etcd": true, "a": true, "etcd-eu": true, "x+y.z-9": true,
		"": false, "Beacon": false, "9etcd": false, "-etcd": false, ".x": false, "+x": false,
		"et cd": false, "etcd_eu": false, "etcd:": false, "é": false,
	} {
		if err := CheckScheme(s); (err == nil) != ok {
			t.Errorf("CheckScheme(%q) = %v, want ok=%v", s, err, ok)
		}
	}
}
