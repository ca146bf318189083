package partition

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin/internal/testdb"
)

var prefix = testdb.Prefix("partition")

func TestMain(m *testing.M) { testdb.Main(m, prefix) }

// onServers runs fn on a table of its own, partitioned by day, on PostgreSQL and MariaDB.
func onServers(t *testing.T, fn func(t *testing.T, tbl Table, db *sql.DB)) {
	for _, tg := range testdb.Databases() {
		if tg.Server == nil {
			continue
		}
		t.Run(tg.Name, func(t *testing.T) {
			db, err := tg.OpenDB(t, tg.NewDatabase(t, prefix)).DB()
			if err != nil {
				t.Fatal(err)
			}
			dialect, create := Postgres, `CREATE TABLE ev (id bigserial, created_at timestamptz NOT NULL, processed boolean NOT NULL DEFAULT false,`+
				` dead_at timestamptz, next_attempt_at timestamptz, PRIMARY KEY (id, created_at)) `
			if tg.Server == testdb.MySQL {
				dialect, create = MySQL, `CREATE TABLE ev (id bigint AUTO_INCREMENT, created_at datetime(6) NOT NULL, processed bool NOT NULL DEFAULT false,`+
					` dead_at datetime(6) NULL, next_attempt_at datetime(6) NULL, PRIMARY KEY (id, created_at)) `
			}
			tbl := NewTable(dialect, "ev")
			now := time.Now().UTC()
			for _, q := range append([]string{create + tbl.PartitionBy(now, 24*time.Hour)}, tbl.NewPartitions(now, 24*time.Hour, nil)...) {
				if _, err := db.Exec(q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			fn(t, tbl, db)
		})
	}
}

// plainGuard is a Guard with no lock: on PostgreSQL the step is a transaction on conn.
func plainGuard(tbl Table, conn *sql.Conn) Guard {
	return func(ctx context.Context) (Execer, func(bool) error, bool, error) {
		if tbl.Dialect != Postgres {
			return conn, func(bool) error { return nil }, true, nil
		}
		tx, err := conn.BeginTx(ctx, nil)
		if err != nil {
			return nil, nil, false, err
		}
		return tx, func(keep bool) error {
			if keep {
				return tx.Commit()
			}
			return tx.Rollback()
		}, true, nil
	}
}

// A partition another maintainer dropped after this one read the layout (without the lock) is gone,
// which is what retiring it wants: not an error. The turn of the second of two relays failed on it.
func TestRetireAPartitionAlreadyDropped(t *testing.T) {
	onServers(t, func(t *testing.T, tbl Table, db *sql.DB) {
		ctx := context.Background()
		conn, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		l, err := tbl.Read(ctx, conn)
		if err != nil {
			t.Fatal(err)
		}
		if len(l.Partitions) != Ahead+2 {
			t.Fatalf("partitions: %+v", l.Partitions)
		}
		gone, kept := l.Partitions[0], l.Partitions[1]
		drop := "DROP TABLE " + tbl.qualify(gone.Name)
		if tbl.Dialect != Postgres {
			drop = "ALTER TABLE ev DROP PARTITION " + tbl.quote(gone.Name)
		}
		if _, err := db.ExecContext(ctx, drop); err != nil {
			t.Fatal(err)
		}
		var r Result
		if err := tbl.retire(ctx, conn, gone, plainGuard(tbl, conn), &r); err != nil {
			t.Fatalf("retire a partition dropped meanwhile: %v", err)
		}
		if len(r.Dropped)+len(r.Kept)+len(r.Busy) != 0 {
			t.Fatalf("a partition dropped meanwhile is none of dropped, kept or busy: %+v", r)
		}

		// The same retire of a partition still there drops it, and keeps one with a pending event.
		if _, err := db.ExecContext(ctx, `INSERT INTO ev (created_at) VALUES (`+tbl.literal(kept.From.Add(time.Hour))+`)`); err != nil {
			t.Fatal(err)
		}
		if err := tbl.retire(ctx, conn, kept, plainGuard(tbl, conn), &r); err != nil {
			t.Fatal(err)
		}
		if len(r.Kept) != 1 || r.Kept[0].Pending != 1 || len(r.Dropped) != 0 {
			t.Fatalf("a partition with a pending event: %+v", r)
		}
		if _, err := db.ExecContext(ctx, `UPDATE ev SET processed = true`); err != nil {
			t.Fatal(err)
		}
		r = Result{}
		if err := tbl.retire(ctx, conn, kept, plainGuard(tbl, conn), &r); err != nil {
			t.Fatal(err)
		}
		if len(r.Dropped) != 1 || r.Dropped[0] != kept.Name {
			t.Fatalf("a partition of processed events: %+v", r)
		}
	})
}
