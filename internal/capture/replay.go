package capture

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"reflect"
)

// When GORM runs a write with RETURNING it reads the returned rows itself, from the *sql.Rows its
// connection gives back. The plugin, to learn what the database wrote, adds columns of its own to that
// RETURNING, reads every row first, and hands GORM a *sql.Rows over the columns GORM asked for, with
// the values the database sent: GORM then scans exactly what it would have scanned without the
// plugin. database/sql builds a *sql.Rows only from a driver, so the rows are served by this small
// in-memory driver: it has no server, no statements and no transactions, and answers one query, whose
// single argument is the rows to serve.

// bufferedRows are result rows read in full: the driver values as the real driver returned them
// (scanned into *any, which keeps them as they are) and the real column types.
type bufferedRows struct {
	columns []string
	types   []*sql.ColumnType
	values  [][]any
}

// replayDB serves bufferedRows. It is safe for concurrent use, like any *sql.DB.
var replayDB = func() *sql.DB {
	db := sql.OpenDB(replayConnector{})
	db.SetMaxIdleConns(16)
	return db
}()

// replay returns a *sql.Rows that reads b.
func replay(ctx context.Context, b *bufferedRows) (*sql.Rows, error) {
	return replayDB.QueryContext(ctx, "replay", b)
}

type replayConnector struct{}

func (replayConnector) Connect(context.Context) (driver.Conn, error) { return replayConn{}, nil }
func (replayConnector) Driver() driver.Driver                        { return replayDriver{} }

type replayDriver struct{}

func (replayDriver) Open(string) (driver.Conn, error) { return replayConn{}, nil }

var errReplayOnly = errors.New("outboxplugin: the replay connection only serves buffered rows")

type replayConn struct{}

func (replayConn) Prepare(string) (driver.Stmt, error) { return nil, errReplayOnly }
func (replayConn) Close() error                        { return nil }
func (replayConn) Begin() (driver.Tx, error)           { return nil, errReplayOnly }

// CheckNamedValue lets the *bufferedRows argument through as it is.
func (replayConn) CheckNamedValue(*driver.NamedValue) error { return nil }

func (replayConn) QueryContext(_ context.Context, _ string, args []driver.NamedValue) (driver.Rows, error) {
	if len(args) != 1 {
		return nil, errReplayOnly
	}
	b, ok := args[0].Value.(*bufferedRows)
	if !ok {
		return nil, errReplayOnly
	}
	return &replayRows{b: b}, nil
}

type replayRows struct {
	b    *bufferedRows
	next int
}

func (r *replayRows) Columns() []string { return r.b.columns }
func (r *replayRows) Close() error      { return nil }

func (r *replayRows) Next(dest []driver.Value) error {
	if r.next >= len(r.b.values) {
		return io.EOF
	}
	for i, v := range r.b.values[r.next] {
		dest[i] = v
	}
	r.next++
	return nil
}

// The column types of the real rows, for code that reads them (GORM does, to scan into maps).

func (r *replayRows) ColumnTypeScanType(i int) reflect.Type {
	if t := r.colType(i); t != nil && t.ScanType() != nil {
		return t.ScanType()
	}
	return reflect.TypeFor[any]()
}

func (r *replayRows) ColumnTypeDatabaseTypeName(i int) string {
	if t := r.colType(i); t != nil {
		return t.DatabaseTypeName()
	}
	return ""
}

func (r *replayRows) ColumnTypeLength(i int) (int64, bool) {
	if t := r.colType(i); t != nil {
		return t.Length()
	}
	return 0, false
}

func (r *replayRows) ColumnTypeNullable(i int) (bool, bool) {
	if t := r.colType(i); t != nil {
		return t.Nullable()
	}
	return false, false
}

func (r *replayRows) ColumnTypePrecisionScale(i int) (int64, int64, bool) {
	if t := r.colType(i); t != nil {
		return t.DecimalSize()
	}
	return 0, 0, false
}

func (r *replayRows) colType(i int) *sql.ColumnType {
	if i < len(r.b.types) {
		return r.b.types[i]
	}
	return nil
}
