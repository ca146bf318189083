package main

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestParseDSN(t *testing.T) {
	for _, c := range []struct{ dsn, kind, driverDSN string }{
		{"postgres://u:p@h/db", kindPostgres, "postgres://u:p@h/db"},
		{"postgresql://h/db", kindPostgres, "postgresql://h/db"},
		{"host=h user=u dbname=db", kindPostgres, "host=h user=u dbname=db"},
		{"dbname=db", kindPostgres, "dbname=db"},
		{"u:p@tcp(h:3306)/db", kindMySQL, "u:p@tcp(h:3306)/db?parseTime=true"},
		{"root@/db", kindMySQL, "root@tcp(127.0.0.1:3306)/db?parseTime=true"},
		{"mysql://u:p@h/db?charset=utf8mb4", kindMySQL, "u:p@tcp(h:3306)/db?charset=utf8mb4&parseTime=true"},
		{"mysql://u@h:3307/db", kindMySQL, "u@tcp(h:3307)/db?parseTime=true"},
		{"sqlite:///var/lib/app.db", kindSQLite, "/var/lib/app.db"},
		{"sqlite://rel/app", kindSQLite, "rel/app"},
		{"file:app.db?cache=shared", kindSQLite, "file:app.db?cache=shared"},
		{"./data/app.sqlite3", kindSQLite, "./data/app.sqlite3"},
		{"app.db", kindSQLite, "app.db"},
	} {
		kind, d, err := parseDSN(c.dsn)
		if err != nil || kind != c.kind || d != c.driverDSN {
			t.Errorf("parseDSN(%q) = %s, %q, %v; want %s, %q", c.dsn, kind, d, err, c.kind, c.driverDSN)
		}
	}
	for _, dsn := range []string{"", "nonsense", "localhost:5432", "app:S3cret@nowhere"} {
		_, _, err := parseDSN(dsn)
		var ue usageError
		if !errors.As(err, &ue) || strings.Contains(err.Error(), "S3cret") {
			t.Errorf("parseDSN(%q): %v, want a usage error that does not quote it", dsn, err)
		}
	}
}

// TestRedact covers the shapes of credentials a driver's error may echo, beyond those the
// binary's tests provoke.
func TestRedact(t *testing.T) {
	for _, c := range []struct{ dsn, text, want string }{
		{"postgres://app:pw%2Fx@h/db", "cannot parse `postgres://app:pw%2Fx@h/db`", "cannot parse `postgres://xxxxx@h/db`"},
		{"postgres://app:pw@h/db", "dial postgres://app:pw@h/db failed", "dial postgres://xxxxx@h/db failed"},
		{"host=h password=s3cr3t dbname=d", "bad dsn host=h password=s3cr3t dbname=d", "bad dsn host=h password=xxxxx dbname=d"},
		{"host=h password='a b' dbname=d", "dsn password='a b' dbname=d", "dsn password=xxxxx dbname=d"},
		{"app:s3cr3t@tcp(h:1)/db", "Error 1045: app:s3cr3t@tcp(h:1)/db", "Error 1045: xxxxx@tcp(h:1)/db"},
		{"app:s3cr3t@tcp(h:1)/db", "the password was s3cr3t", "the password was xxxxx"},
		{"", "other creds root:hunter2@tcp(x)/", "other creds xxxxx@tcp(x)/"},
		{"app.db", "created 2026-01-02T15:04:05Z, event 0194c7a2", "created 2026-01-02T15:04:05Z, event 0194c7a2"},
	} {
		a := &app{dsn: c.dsn}
		if got := a.redact(c.text); got != c.want {
			t.Errorf("redact(%q) with DSN %q = %q, want %q", c.text, c.dsn, got, c.want)
		}
	}
}

func TestParseAge(t *testing.T) {
	for in, want := range map[string]time.Duration{
		"0s": 0, "90m": 90 * time.Minute, "7d": 7 * 24 * time.Hour, "1d12h": 36 * time.Hour, "1.5d": 36 * time.Hour,
	} {
		if got, err := parseAge(in); err != nil || got != want {
			t.Errorf("parseAge(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "-1h", "-2d", "1d-3h", "7x", "d", "xd"} {
		if _, err := parseAge(in); err == nil {
			t.Errorf("parseAge(%q) accepted", in)
		}
	}
}

func TestAskYesNo(t *testing.T) {
	for in, yes := range map[string]bool{"y\n": true, "YES\n": true, " y ": true, "n\n": false, "\n": false, "": false, "maybe\n": false} {
		var out strings.Builder
		err := askYesNo(strings.NewReader(in), &out, "requeue?")
		if (err == nil) != yes || (err != nil && !errors.Is(err, errRefused)) {
			t.Errorf("answer %q: %v", in, err)
		}
		if out.String() != "requeue? [y/N] " {
			t.Errorf("prompt %q", out.String())
		}
	}
}
