package capture

import (
	"context"
	"database/sql"
	"os"
	"strings"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/gorm-outbox/outboxplugin/internal/testdb"
	"github.com/gorm-outbox/outboxplugin/internal/testjson"
)

// The events that ride on the COMMIT are written as literals (appendPGLiteral): whatever a string
// holds, PostgreSQL must read back the very string, with standard_conforming_strings on (the default)
// and off. Checked on the server, in one session of each setting, against the same value bound as a
// parameter. No table is made: the statements only compare values.
//
//	go test -run '^$' -fuzz FuzzPGLiteral -fuzztime 30s ./internal/capture
func FuzzPGLiteral(f *testing.F) {
	for _, s := range testjson.Strings {
		f.Add(s)
	}
	for _, s := range []string{"", "'", "''", `\`, `\'`, `'\`, `\\'`, `E'\''`, "a'; COMMIT; --", `{"a":"\"\\"}`, "€ ✓ \U0001F600", "$1", "$$", "$1::text"} {
		f.Add(s)
	}
	db, err := sql.Open("pgx", testdb.Postgres.DatabaseDSN("postgres"))
	if err != nil {
		f.Fatal(err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		if os.Getenv("OUTBOX_REQUIRE_DBS") == "1" {
			f.Fatalf("postgres unreachable and OUTBOX_REQUIRE_DBS=1: %v", err)
		}
		f.Skipf("postgres unreachable: %v", err)
	}
	db.SetMaxOpenConns(2)
	sessions := map[string]*sql.Conn{}
	for _, scs := range []string{"on", "off"} {
		c, err := db.Conn(ctx)
		if err != nil {
			f.Fatal(err)
		}
		defer c.Close()
		if _, err := c.ExecContext(ctx, "SET standard_conforming_strings = "+scs); err != nil {
			f.Fatal(err)
		}
		sessions[scs] = c
	}
	f.Fuzz(func(t *testing.T, s string) {
		var b strings.Builder
		ok := appendPGLiteral(&b, s)
		if strings.IndexByte(s, 0) >= 0 {
			if ok {
				t.Fatalf("a string with a NUL byte was written as a literal: %q", b.String())
			}
			return
		}
		if !ok {
			t.Fatalf("not written: %q", s)
		}
		for scs, c := range sessions {
			// The literal, then the value as a parameter: the simple protocol of the literal is the
			// path of the commit (no arguments), so the comparison reads the literal's value back.
			var got string
			err := c.QueryRowContext(ctx, "SELECT "+b.String()+"::text").Scan(&got)
			if !validUTF8(s) {
				// PostgreSQL refuses text that is not UTF-8, as a bound parameter would be.
				if err == nil {
					t.Fatalf("standard_conforming_strings %s: invalid UTF-8 %q read as %q", scs, s, got)
				}
				continue
			}
			if err != nil {
				t.Fatalf("standard_conforming_strings %s: %s: %v", scs, b.String(), err)
			}
			if got != s {
				t.Fatalf("standard_conforming_strings %s: %q written as %s read back as %q", scs, s, b.String(), got)
			}
		}
	})
}

func validUTF8(s string) bool { return strings.ToValidUTF8(s, "\uFFFD") == s }

// A time is written as UTC with microseconds, truncated, as pgx truncates a bound time; nil is NULL;
// a value of another type is not written.
func TestPGLiteralOfOtherValues(t *testing.T) {
	var b strings.Builder
	at := time.Date(2026, 12, 7, 1, 2, 3, 456789999, time.FixedZone("X", 3600))
	if !appendPGLiteral(&b, at) || b.String() != "'2026-12-07 00:02:03.456789Z'" {
		t.Errorf("time written as %s", b.String())
	}
	b.Reset()
	if !appendPGLiteral(&b, nil) || b.String() != "NULL" {
		t.Errorf("nil written as %s", b.String())
	}
	b.Reset()
	if appendPGLiteral(&b, 42) {
		t.Errorf("an int was written: %s", b.String())
	}
	b.Reset()
	if !appendInlined(&b, "VALUES ($1::text,$2::json,$3)", []any{"a'b", nil, `x\y`}) || b.String() != `VALUES ('a''b'::text,NULL::json,E'x\\y')` {
		t.Errorf("inlined as %s", b.String())
	}
	b.Reset()
	if appendInlined(&b, "VALUES ($1,$2)", []any{"only one"}) {
		t.Errorf("a bind variable without its argument was written: %s", b.String())
	}
}
