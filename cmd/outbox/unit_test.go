package main

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
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

func TestParseKafkaURL(t *testing.T) {
	seeds := []string{"k1:9092", "k2:9092"}
	for _, c := range []struct {
		raw  string
		want kafkaURL
	}{
		{"kafka://k1:9092", kafkaURL{seeds: seeds[:1]}},
		{"kafka://k1:9092,k2:9092", kafkaURL{seeds: seeds}},
		{"KAFKA://k1:9092/, kafka://k2:9092", kafkaURL{seeds: seeds}},
		{"kafka://[::1]:9092", kafkaURL{seeds: []string{"[::1]:9092"}}},
		{"kafkas://k1:9092,k2:9092", kafkaURL{seeds: seeds, tls: true}},
		{"kafkas://k1:9092,kafkas://k2:9092", kafkaURL{seeds: seeds, tls: true}},
		// Credentials without ?sasl= log in with SCRAM-SHA-512.
		{"kafka://u:p@k1:9092,k2:9092", kafkaURL{seeds: seeds, mechanism: saslSCRAMSHA512, user: "u", pass: "p"}},
		{"kafka://u:p@k1:9092,u:p@k2:9092", kafkaURL{seeds: seeds, mechanism: saslSCRAMSHA512, user: "u", pass: "p"}},
		{"kafka://u:p@k1:9092,k2:9092?sasl=plain", kafkaURL{seeds: seeds, mechanism: saslPlain, user: "u", pass: "p"}},
		{"kafkas://u:p@k1:9092/?sasl=PLAIN,k2:9092", kafkaURL{seeds: seeds, tls: true, mechanism: saslPlain, user: "u", pass: "p"}},
		{"kafka://u:p@k1:9092?sasl=scram-sha-256", kafkaURL{seeds: seeds[:1], mechanism: saslSCRAMSHA256, user: "u", pass: "p"}},
		{"kafka://u:p@k1:9092?sasl=scram-sha-512,k2:9092?sasl=scram-sha-512", kafkaURL{seeds: seeds, mechanism: saslSCRAMSHA512, user: "u", pass: "p"}},
		// URL-encoded user and password.
		{"kafkas://relay%40shop:S3cret%2C%3A%2F%3F%23%40%25+x@k1:9092", kafkaURL{seeds: seeds[:1], tls: true,
			mechanism: saslSCRAMSHA512, user: "relay@shop", pass: "S3cret,:/?#@%+x"}},
	} {
		got, err := parseKafkaURL(c.raw)
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("parseKafkaURL(%q) = %+v, %v; want %+v", c.raw, got, err, c.want)
		}
		if m := got.saslMechanism(); (m == nil) != (c.want.mechanism == "") ||
			(m != nil && !strings.EqualFold(m.Name(), c.want.mechanism)) {
			t.Errorf("parseKafkaURL(%q): SASL mechanism %v, want %q", c.raw, m, c.want.mechanism)
		}
	}
}

func TestParseKafkaURLRefusals(t *testing.T) {
	for _, raw := range []string{
		"kafka://k1",
		"kafka://k1:",
		"kafka://k1:9092/topic",
		"kafka://k1:9092,",
		"kafka://k1:9092,nats://k2:4222",
		"kafkas://k1:9092,kafka://k2:9092",
		"kafka://k1:9092,kafkas://k2:9092",
		"kafka://k1:9092,u:S3cret@k2:9092",
		"kafka://u:S3cret@k1:9092,v:S3cret@k2:9092",
		"kafka://u:S3cret@k1:9092,u:S3cret2@k2:9092",
		"kafka://u@k1:9092",
		"kafka://u:@k1:9092",
		"kafka://:S3cret@k1:9092",
		"kafka://u:S3cret%@k1:9092",
		"kafka://u:S3c,ret@k1:9092",
		"kafka://u:S3c#ret@k1:9092",
		"kafka://u:S3cret@k1:9092?sasl=gssapi",
		"kafka://u:S3cret@k1:9092?sasl=oauthbearer",
		"kafka://u:S3cret@k1:9092?sasl=",
		"kafka://u:S3cret@k1:9092?sasl=plain&sasl=scram-sha-256",
		"kafka://u:S3cret@k1:9092?sasl=plain,k2:9092?sasl=scram-sha-512",
		"kafka://u:S3cret@k1:9092?tls=true",
		"kafka://u:S3cret@k1:9092?sasl=%zz",
		"kafka://k1:9092?sasl=plain",
	} {
		_, err := parseKafkaURL(raw)
		var ue usageError
		if !errors.As(err, &ue) || strings.Contains(err.Error(), "S3c") || strings.Contains(err.Error(), "k1") {
			t.Errorf("parseKafkaURL(%q): %v, want a usage error that does not quote it", raw, err)
		}
	}
}

// TestBrokerPasswords: the password of a broker URL is found whichever seed carries it, and in the
// forms it may be printed in.
func TestBrokerPasswords(t *testing.T) {
	for _, c := range []struct{ raw, password string }{
		{"kafka://u:S3cret@k1:9092,k2:9092", "S3cret"},
		{"kafka://k1:9092,u:S3cret@k2:9092", "S3cret"},
		{"kafka://k1:9092,kafka://u:S3cret@k2:9092", "S3cret"},
		{"kafkas://u:S3c%2Cret@k1:9092?sasl=plain", "S3c,ret"},
		{"kafkas://u:S3c%2Cret@k1:9092?sasl=plain", "S3c%2Cret"},
		{"kafka://u:S3c,ret@k1:9092", "S3c,ret"},
		{"nats://u:S3cret@n1:4222,nats://u:S3cret@n2:4222", "S3cret"},
		{"amqp://u:S3c%2Fret@r:5672/", "S3c/ret"},
	} {
		if got := brokerPasswords(c.raw); !slices.Contains(got, c.password) {
			t.Errorf("brokerPasswords(%q) = %q, want %q among them", c.raw, got, c.password)
		}
	}
}

func TestCAFile(t *testing.T) {
	_, caPath := selfSignedTLS(t)
	var c caFile
	if err := c.Set(caPath); err != nil || c.roots == nil || c.String() != caPath {
		t.Fatalf("Set(%s): %v, roots %v, String %q", caPath, err, c.roots, c.String())
	}
	notPEM := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(notPEM, []byte("-----BEGIN NOTHING-----\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{notPEM, filepath.Join(t.TempDir(), "missing.pem")} {
		var c caFile
		if err := c.Set(path); err == nil || c.roots != nil {
			t.Errorf("Set(%s): %v, roots %v; want an error and no roots", path, err, c.roots)
		}
	}
}
