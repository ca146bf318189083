package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// TestCompare runs the whole comparison once with a tiny backlog on each real server, with one and
// with two consumers per variant: every variant must deliver exactly the backlog (compare fails
// otherwise, and a duplicate would show as more), the report must carry every variant and ratio, and
// the run's database must be gone afterwards. A server that does not answer is skipped, or fails the
// test under OUTBOX_REQUIRE_DBS=1.
func TestCompare(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	servers := []target{
		{postgresKind, envOr("OUTBOX_POSTGRES_DSN", "host=127.0.0.1 port=5432 user=postgres dbname=postgres sslmode=disable")},
		{mysqlKind, envOr("OUTBOX_MYSQL_DSN", "root@tcp(127.0.0.1:3306)/")},
	}
	for _, srv := range servers {
		for _, consumers := range []int{1, 2} {
			t.Run(fmt.Sprintf("%s/consumers=%d", srv.kind, consumers), func(t *testing.T) {
				s, err := openServer(ctx, srv.kind, srv.dsn)
				if errors.Is(err, errUnreachable) && os.Getenv("OUTBOX_REQUIRE_DBS") != "1" {
					t.Skip(err)
				}
				if err != nil {
					t.Fatal(err)
				}
				closed := false
				t.Cleanup(func() {
					if !closed {
						if err := s.close(); err != nil {
							t.Error(err)
						}
					}
				})

				const events = 300
				cfg := config{events: events, rounds: 1, consumers: consumers}
				want := []string{"raw", "worker", "watermill_default", "watermill_tuned"}
				ratios := []string{"worker/raw", "worker/watermill_tuned", "worker/watermill_default"}
				if consumers == 2 {
					// -worker-batch adds the worker with that batch size, and its ratios.
					cfg.workerBatch = 50
					want = append(want, "worker_batch50")
					ratios = append(ratios, "worker_batch50/raw", "worker_batch50/watermill_tuned")
				}
				res, err := compare(ctx, s, cfg)
				if err != nil {
					t.Fatal(err)
				}
				if len(res.rows) != len(want) {
					t.Fatalf("%d variants reported, want %d", len(res.rows), len(want))
				}
				for i, row := range res.rows {
					if row.variant != want[i] || len(row.rates) != 1 || row.rates[0] <= 0 {
						t.Errorf("row %d: %s with rates %v, want %s with one positive rate", i, row.variant, row.rates, want[i])
					}
				}
				var report bytes.Buffer
				writeReport(&report, res)
				for _, s := range append(want, ratios...) {
					if !strings.Contains(report.String(), "| "+s+" |") && !strings.Contains(report.String(), s+" **") {
						t.Errorf("report lacks %s:\n%s", s, report.String())
					}
				}
				t.Log("\n" + report.String())

				closed = true
				if err := s.close(); err != nil {
					t.Fatal(err)
				}
				if exists, err := databaseExists(ctx, s); err != nil || exists {
					t.Errorf("database %s still there after close (err %v)", s.database, err)
				}
			})
		}
	}
}

// databaseExists reports whether the run's database is on the server.
func databaseExists(ctx context.Context, s *server) (bool, error) {
	admin, err := s.openAdmin()
	if err != nil {
		return false, err
	}
	defer admin.Close()
	q := "SELECT COUNT(*) FROM pg_database WHERE datname = $1"
	if s.kind == mysqlKind {
		q = "SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name = ?"
	}
	var n int
	err = admin.QueryRowContext(ctx, q, s.database).Scan(&n)
	return n > 0, err
}
