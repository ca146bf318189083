package store

import (
	"errors"
	"strings"
	"testing"
)

// Each engine is judged by the version it answers, as servers of each kind spell it.
func TestCheckEngine(t *testing.T) {
	for _, c := range []struct {
		dialect, version string
		refused          bool
		says             string
	}{
		{"mysql", "8.0.36", false, ""},
		{"mysql", "8.4.2-log", false, ""},
		{"mysql", "8.0.1", false, ""},
		{"mysql", "8.0.0-dmr", true, "8.0.1"},
		{"mysql", "5.7.44-log", true, "8.0.1"},
		{"mysql", "8.0.11-TiDB-v7.5.1", true, "TiDB"},
		{"mysql", "5.7.25-TiDB-v6.5.0", true, "TiDB"},
		{"mysql", "10.11.6-MariaDB-0+deb12u1", false, ""},
		{"mysql", "5.5.5-10.11.6-MariaDB", false, ""},
		{"mysql", "11.4.2-MariaDB", false, ""},
		{"mysql", "10.6.0-MariaDB", false, ""},
		{"mysql", "10.5.23-MariaDB-1:10.5.23+maria~deb11", true, "10.6"},
		{"mysql", "5.5.5-10.3.39-MariaDB", true, "10.6"},
		{"mysql", "8.0.mysql_aurora.3.05.2", false, ""},
		{"mysql", "5.7.mysql_aurora.2.11.2", true, "8.0.1"},
		{"mysql", "something else", false, ""},
		{"postgres", "PostgreSQL 15.5 (Debian 15.5-0+deb12u1) on x86_64-pc-linux-gnu", false, ""},
		{"postgres", "PostgreSQL 17beta1 on x86_64", false, ""},
		{"postgres", "PostgreSQL 9.5.25 on x86_64", false, ""},
		{"postgres", "PostgreSQL 9.4.26 on x86_64", true, "9.5"},
		{"postgres", "PostgreSQL 8.0.2 on i686-pc-linux-gnu, Redshift 1.0.77467", true, "9.5"},
		{"sqlite", "3.46.0", false, ""},
	} {
		err := checkEngine(c.dialect, c.version)
		if got := errors.Is(err, ErrUnsupportedEngine); got != c.refused {
			t.Errorf("%s %q: refused %v, want %v (%v)", c.dialect, c.version, got, c.refused, err)
			continue
		}
		if c.refused && (!strings.Contains(err.Error(), c.version) || !strings.Contains(err.Error(), c.says)) {
			t.Errorf("%s %q: the error should name the version and %q: %v", c.dialect, c.version, c.says, err)
		}
	}
}
