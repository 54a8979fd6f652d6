package setting

import "testing"

func TestName(t *testing.T) {
	flags := Namer(func(field string) string {
		return map[string]string{"Config.MaxStreams": "--max-streams", "Config.TLS.CertFile": "--cert-file"}[field]
	})
	for _, tc := range []struct {
		n     Namer
		field string
		want  string
	}{
		{nil, "Config.MaxStreams", "Config.MaxStreams"},
		{flags, "Config.MaxStreams", "--max-streams"},
		{flags, "Config.Unmapped", "Config.Unmapped"}, // a field no flag sets keeps its name
	} {
		if got := tc.n.Name(tc.field); got != tc.want {
			t.Errorf("Name(%q) = %q, want %q", tc.field, got, tc.want)
		}
	}
	if got, want := flags.Names("Config.TLS.CertFile", "Config.MaxStreams"), "--cert-file and --max-streams"; got != want {
		t.Errorf("Names = %q, want %q", got, want)
	}
}
