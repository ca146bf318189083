package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"
	"gorm.io/gorm"
)

// rawVariant is the hand-written relay the others are measured against, written with database/sql
// alone: in one transaction, claim 100 events with FOR UPDATE SKIP LOCKED, publish nothing, mark them
// processed, commit; until a claim comes back empty. It drains the worker's table, filled the same
// way.
func rawVariant(s *server, db *gorm.DB) variant {
	var deadlocks atomic.Int64
	return variant{
		name:    "raw",
		prepare: func(ctx context.Context, n int) error { return prepareOutbox(ctx, s, db, n) },
		drain: func(ctx context.Context, n, consumers int) (drained, error) {
			var delivered atomic.Int64
			errs := make(chan error, consumers)
			start := time.Now()
			for range consumers {
				go func() { errs <- rawLoop(ctx, s, int64(n), &delivered, &deadlocks) }()
			}
			var all []error
			for range consumers {
				all = append(all, <-errs)
			}
			return drained{events: delivered.Load(), spent: time.Since(start)}, errors.Join(all...)
		},
		notes: func() []string {
			if d := deadlocks.Load(); d > 0 {
				return []string{fmt.Sprintf("%d claims rolled back as deadlocks and retried (all rounds)", d)}
			}
			return nil
		},
	}
}

// rawLoop claims and marks batches until all n events are delivered, adding each committed batch to
// delivered. A batch MariaDB rolls back as a deadlock (two loops at once) is claimed again, as a
// hand-written relay would. An empty claim ends the loop only once every event is delivered: with two
// loops, a claim can come back empty while the other loop holds the rest (SKIP LOCKED) and then rolls
// back, and a loop that stopped there left the rest undelivered (TestCompare once saw 100 of 300).
func rawLoop(ctx context.Context, s *server, n int64, delivered, deadlocks *atomic.Int64) error {
	// The order names the claim index's columns where PostgreSQL needs them to read the index in
	// order; MariaDB sorts otherwise, so it gets created_at, id alone (as in BenchmarkRelayThroughput).
	order := "processed, dead_at, next_attempt_at, created_at, id"
	if s.kind == mysqlKind {
		order = "created_at, id"
	}
	claim := `SELECT id, message_id, event_type, aggregate_type, aggregate_id, payload, headers, created_at, attempts
		FROM ` + outboxTable + ` WHERE processed = false AND dead_at IS NULL AND next_attempt_at IS NULL
		ORDER BY ` + order + ` LIMIT 100 FOR UPDATE SKIP LOCKED`
	ids := make([]int64, 0, 100)
	for {
		var err error
		ids, err = rawBatch(ctx, s, claim, ids[:0])
		if isDeadlock(err) {
			deadlocks.Add(1)
			continue
		}
		if err != nil {
			return fmt.Errorf("raw loop: %w", err)
		}
		if len(ids) == 0 {
			if delivered.Load() >= n {
				return nil
			}
			select { // the other loop holds the rest: poll, as a relay would
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Millisecond):
			}
			continue
		}
		delivered.Add(int64(len(ids)))
	}
}

// rawBatch claims one batch, marks it processed and commits; it returns the ids it marked.
func rawBatch(ctx context.Context, s *server, claim string, ids []int64) (_ []int64, err error) {
	tx, err := s.pool.BeginTx(ctx, nil)
	if err != nil {
		return ids, err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	rows, err := tx.QueryContext(ctx, claim)
	if err != nil {
		return ids, err
	}
	for rows.Next() {
		var (
			id                                   int64
			messageID, eventType, aggType, aggID string
			payload, headers                     []byte
			createdAt                            time.Time
			attempts                             int
		)
		if err := rows.Scan(&id, &messageID, &eventType, &aggType, &aggID, &payload, &headers, &createdAt, &attempts); err != nil {
			rows.Close()
			return ids, err
		}
		ids = append(ids, id)
	}
	if err := rows.Close(); err != nil {
		return ids, err
	}
	if err := rows.Err(); err != nil {
		return ids, err
	}
	if len(ids) == 0 {
		return ids, tx.Commit()
	}
	if _, err := tx.ExecContext(ctx, markStatement(s.kind, len(ids)), markArgs(ids)...); err != nil {
		return ids, err
	}
	return ids, tx.Commit()
}

// markStatement marks n claimed events processed, the ids passed as parameters in the driver's
// placeholders ($n on PostgreSQL, ? on MySQL).
func markStatement(kind string, n int) string {
	var b strings.Builder
	b.WriteString("UPDATE " + outboxTable + " SET processed = true, processed_at = ")
	placeholder := func(i int) string {
		if kind == postgresKind {
			return "$" + strconv.Itoa(i)
		}
		return "?"
	}
	b.WriteString(placeholder(1) + " WHERE id IN (")
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(placeholder(i + 2))
	}
	b.WriteString(")")
	return b.String()
}

func markArgs(ids []int64) []any {
	args := make([]any, 0, len(ids)+1)
	args = append(args, time.Now().UTC())
	for _, id := range ids {
		args = append(args, id)
	}
	return args
}

func isDeadlock(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == 1213
}
