package store

import (
	"context"
	"database/sql"
	"strconv"
	"strings"
	"time"
)

// sqliteRelay is the relay's SQL on SQLite: a claim is one UPDATE … WHERE id IN (due run UNION ALL
// fresh run) RETURNING, which holds the database's write lock from its start, so that two relays'
// claims run one after the other (SQLite has no row locks, and GORM writes no FOR UPDATE for it). Run's
// claims mark the previous batch done in the same transaction.
type sqliteRelay struct {
	claimUpdate string
}

func (d *sqliteRelay) build(_ *Store, p claimParts) {
	d.claimUpdate = p.stamp + `id IN (` + p.pickUnion("id") + `) RETURNING ` + returnedColumns
}

func (d *sqliteRelay) claim(ctx context.Context, q *Store, owner string, now time.Time, prev *Done, deleteDone bool) (claimed []Row, marked int64, err error) {
	err = q.InTx(ctx, func(tx *sql.Tx) error {
		if prev != nil {
			var err error
			if marked, err = q.MarkDone(ctx, tx, owner, *prev, deleteDone); err != nil {
				return err
			}
		}
		rows, err := tx.QueryContext(ctx, d.claimUpdate, q.claimArgs(owner, now)...)
		if err != nil {
			return err
		}
		claimed, err = q.scanClaimed(rows, 0, false, nil)
		return err
	})
	return claimed, marked, err
}

func (*sqliteRelay) literal(query string, args []any) (string, []any) { return query, args }

func (*sqliteRelay) bind(query string) string { return query }

func (*sqliteRelay) idList(ids []int64) (string, []any) { return inList(ids) }

func (*sqliteRelay) rowsMatch(ids []int64, _ []string) (string, []any) { return inList(ids) }

func (*sqliteRelay) renew(ctx context.Context, db *sql.DB, query string, args []any) (map[int64]string, int64, error) {
	return execRenew(ctx, db, query, args)
}

func (*sqliteRelay) cleanupQuery(table string) string {
	return `DELETE FROM ` + table + ` WHERE id IN (SELECT id FROM ` + table + ` WHERE processed = true AND created_at < ? LIMIT ?)`
}

// tryLock always succeeds: SQLite serialises writers anyway, and one database file is one host's.
func (*sqliteRelay) tryLock(_ context.Context, conn *sql.Conn, _ string) (QueryExecer, func(bool) error, bool, error) {
	return conn, func(bool) error { return nil }, true, nil
}

func (*sqliteRelay) clock(now time.Time) time.Time { return now }

// timeSQL takes the worker's clock: a SQLite database is a file of one host, whose relays share its
// clock, and SQLite stores times as text, which the driver writes from the bound times.
func (*sqliteRelay) timeSQL(context.Context, *sql.DB) (dbTime, error) { return boundTime, nil }

func (*sqliteRelay) listens() bool { return false }

// sessionSetup: a SQLite transaction cannot outlive its process, and has no network to lose.
func (*sqliteRelay) sessionSetup(time.Duration) string { return "" }

func (*sqliteRelay) sessionReset() string { return "" }

func (*sqliteRelay) unknownSetting(error) bool { return false }

func (*sqliteRelay) txSetup(time.Duration) string { return "" }

// retryable: SQLite claims wait for the write lock (the DSN's busy timeout) and never deadlock.
func (*sqliteRelay) retryable(error) bool { return false }

// appendHistory appends with json_insert at the end ($[#]). SQLite's paths have no ranges: the last keep
// entries are those json_each numbers from the length less keep, gathered again in their order. The
// column is text, which nothing keeps from holding something else than JSON: a history that is not
// valid JSON is taken for none, rather than failing the statement that records a failure.
func (*sqliteRelay) appendHistory(keep int, entry string) string {
	if keep == 0 {
		return `json_array(` + entry + `)`
	}
	const valid = `CASE WHEN json_valid(attempt_history) THEN attempt_history END`
	return `json_insert((SELECT json_group_array(json(value)) FROM json_each(` + valid + `) WHERE key >= json_array_length(` + valid + `) - ` +
		strconv.Itoa(keep) + `), '$[#]', ` + entry + `)`
}

func (*sqliteRelay) jsonParam() string { return `json(?)` }

func (*sqliteRelay) jsonObject(pairs ...string) string {
	return `json_object(` + strings.Join(pairs, ", ") + `)`
}
