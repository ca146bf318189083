package main

import (
	"context"
	"fmt"

	"github.com/gorm-outbox/outboxplugin"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// The outbox table the raw loop and the worker drain: created by outboxplugin.AutoMigrate, as an
// application creates it, and filled by one INSERT … SELECT the database generates (the fill of the
// core module's BenchmarkRelayThroughput).

const outboxTable = outboxplugin.DefaultTableName

// openGorm opens GORM over the server's pool with the plugin registered, as an application does.
func openGorm(s *server) (*gorm.DB, error) {
	var d gorm.Dialector
	if s.kind == postgresKind {
		d = postgres.New(postgres.Config{Conn: s.pool})
	} else {
		d = mysql.New(mysql.Config{Conn: s.pool})
	}
	db, err := gorm.Open(d, &gorm.Config{Logger: logger.Discard})
	if err != nil {
		return nil, fmt.Errorf("open gorm: %w", err)
	}
	if err := db.Use(outboxplugin.New()); err != nil {
		return nil, fmt.Errorf("register plugin: %w", err)
	}
	return db, nil
}

// prepareOutbox re-creates the outbox table with AutoMigrate (its indexes and storage settings) and
// fills it with n pending events.
func prepareOutbox(ctx context.Context, s *server, db *gorm.DB, n int) error {
	if err := s.dropTables(ctx, outboxTable); err != nil {
		return err
	}
	if err := outboxplugin.AutoMigrate(db.WithContext(ctx)); err != nil {
		return err
	}
	if err := fillOutbox(ctx, s, db, n); err != nil {
		return err
	}
	return s.afterFill(ctx, outboxTable)
}

// fillOutbox inserts n pending events Bench_create {"id": <n>} in one statement, created one
// microsecond apart.
func fillOutbox(ctx context.Context, s *server, db *gorm.DB, n int) error {
	q := `INSERT INTO ` + outboxTable + ` (message_id, event_type, aggregate_type, aggregate_id, payload, created_at, processed)
		SELECT md5(g::text || clock_timestamp()::text)::uuid::text, 'Bench_create', 'Bench', g::text,
		       jsonb_build_object('id', g), clock_timestamp() + g * interval '1 microsecond', false
		FROM generate_series(1, ?) g`
	if s.kind == mysqlKind {
		// Six cross-joined digits instead of a recursive CTE, which MariaDB caps at
		// max_recursive_iterations.
		q = `INSERT INTO ` + outboxTable + ` (message_id, event_type, aggregate_type, aggregate_id, payload, created_at, processed)
			WITH d(x) AS (SELECT 0 UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4
			              UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9),
			     g(n) AS (SELECT 1 + a.x + 10*b.x + 100*c.x + 1000*e.x + 10000*f.x + 100000*h.x
			              FROM d a, d b, d c, d e, d f, d h)
			SELECT uuid(), 'Bench_create', 'Bench', n, JSON_OBJECT('id', n), UTC_TIMESTAMP(6) + INTERVAL n MICROSECOND, false
			FROM g WHERE n <= ? ORDER BY n`
		if n > 999999 {
			return fmt.Errorf("fill %s: at most 999999 events on MySQL, not %d", outboxTable, n)
		}
	}
	if err := db.WithContext(ctx).Exec(q, n).Error; err != nil {
		return fmt.Errorf("fill %s: %w", outboxTable, err)
	}
	return nil
}

// workerVariant is this repository's relay with its default options, NewWorker(db, pub), or with
// WithBatchSize(batch) when batch is not 0 (variant worker_batch<batch>); Run, that many workers at
// once, stopped once the publisher has counted every event.
func workerVariant(s *server, db *gorm.DB, batch int) variant {
	name, describe := "worker", ""
	var opts []outboxplugin.WorkerOption
	if batch != 0 {
		name = fmt.Sprintf("worker_batch%d", batch)
		describe = fmt.Sprintf("NewWorker(db, pub, WithBatchSize(%d)), the rest default", batch)
		opts = append(opts, outboxplugin.WithBatchSize(batch))
	}
	return variant{
		name:     name,
		describe: describe,
		prepare:  func(ctx context.Context, n int) error { return prepareOutbox(ctx, s, db, n) },
		drain: func(ctx context.Context, n, consumers int) (drained, error) {
			delivered := newCounter(n)
			pub := outboxplugin.PublisherFunc(func(_ context.Context, msgs []outboxplugin.Message) error {
				delivered.add(len(msgs))
				return nil
			})
			workers := make([]consumer, consumers)
			for i := range workers {
				w, err := outboxplugin.NewWorker(db, pub, opts...)
				if err != nil {
					return drained{}, err
				}
				workers[i] = consumer{run: w.Run} // Run returns when its context ends
			}
			return deliver(ctx, delivered, workers)
		},
	}
}
