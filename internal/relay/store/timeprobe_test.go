package store

import (
	"testing"

	"github.com/gorm-outbox/outboxplugin/internal/testdb"
)

// A caller that holds a one-connection pool's only connection gets no time literals, and pays the
// probe's wait for a connection once, not at every statement; the claim's own probe is not held back.
func TestTimeProbeBacksOffWhenItCannotRun(t *testing.T) {
	for _, tg := range testdb.Databases() {
		if tg.Name != "mysql" {
			continue
		}
		db := tg.OpenDB(t, tg.NewDatabase(t, testdb.Prefix("storeprobe")))
		sqlDB, err := db.DB()
		if err != nil {
			t.Fatal(err)
		}
		sqlDB.SetMaxOpenConns(1)
		conn, err := sqlDB.Conn(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		var lits timeLiterals
		if lits.utc(sqlDB) || lits.utc(sqlDB) {
			t.Fatal("no probe can run: times stay arguments")
		}
		if lits.attempts != 1 {
			t.Fatalf("%d probes, want 1: the second waits for the retry", lits.attempts)
		}
		if err := conn.Close(); err != nil {
			t.Fatal(err)
		}
		if utc, err := lits.probe(t.Context(), sqlDB, false); err != nil || !utc {
			t.Fatalf("the claim's probe runs whatever the back-off: %v, %v", utc, err)
		}
		if lits.attempts != 2 || !lits.utc(sqlDB) {
			t.Fatalf("known once answered: attempts %d", lits.attempts)
		}
	}
}
