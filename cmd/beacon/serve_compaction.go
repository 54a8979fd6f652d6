package main

import (
	"strconv"
	"time"

	"github.com/beaconplane/beacon/server"
	"github.com/spf13/pflag"
)

// addCompactionFlag adds --auto-compaction-retention, with etcd's name and
// syntax: a duration ("5m", "1h30m") or a number of hours ("1"); "0"
// keeps every revision.
func addCompactionFlag(f *pflag.FlagSet) {
	f.String("auto-compaction-retention", server.DefaultAutoCompactionRetention.String(),
		"history of changes the embedded etcd keeps: it compacts older revisions every period (at most every hour); "+
			`a duration, or hours as in etcd ("1"); "0" keeps every revision (then compact with etcdctl, or etcd's quota fills and it refuses writes)`)
}

// compactionRetention reads --auto-compaction-retention into
// server.Config.AutoCompactionRetention: zero (the default) when the flag
// is not given, negative for "0".
func compactionRetention(f *pflag.FlagSet) (time.Duration, error) {
	fl := f.Lookup("auto-compaction-retention")
	if fl == nil || !fl.Changed {
		return 0, nil
	}
	v := fl.Value.String()
	d, err := time.ParseDuration(v)
	if err != nil {
		h, herr := strconv.Atoi(v)
		if herr != nil {
			return 0, usagef("--auto-compaction-retention %q: want a duration such as 5m or 1h, a number of hours, or 0 to keep every revision", v)
		}
		d = time.Duration(h) * time.Hour
	}
	switch {
	case d < 0:
		return 0, usagef("--auto-compaction-retention %q: must not be negative (0 keeps every revision)", v)
	case d > 0 && d < time.Second:
		// The library's message would say "negative keeps everything":
		// true of the Config field, not of the flag.
		return 0, usagef("--auto-compaction-retention %s: keep at least 1s of history (0 keeps every revision)", v)
	case d == 0:
		return -1, nil
	}
	return d, nil
}
