package outboxplugin

import (
	"fmt"
	"strings"
	"time"

	"gorm.io/gorm"
)

// insertColumns are the columns the plugin writes; processed and attempts take their defaults, the
// relay's columns start NULL.
var insertColumns = [...]string{"message_id", "event_type", "aggregate_type", "aggregate_id", "payload", "headers", "created_at"}

// maxRowsPerInsert bounds one INSERT: 1000 rows of 7 values stay far below the bind-parameter limits
// of PostgreSQL and MySQL (65535) and SQLite (32766). A statement that changes more rows writes its
// events in INSERTs of this size.
const maxRowsPerInsert = 1000

type insertShape struct {
	dialect string
	rows    int
}

// insertEvents writes events with multi-row INSERTs on pool (the transaction of the write).
func (p *Plugin) insertEvents(db *gorm.DB, pool gorm.ConnPool, events []pendingEvent) error {
	ctx := db.Statement.Context
	for len(events) > 0 {
		n := min(len(events), maxRowsPerInsert)
		query := p.insertSQL(db, n)
		args := make([]any, 0, n*len(insertColumns))
		for i := range events[:n] {
			e := &events[i]
			var headers any
			if e.headers != nil {
				headers = *e.headers
			}
			args = append(args, e.messageID, e.eventType, e.aggregateType, e.aggregateID, e.payload, headers, e.createdAt)
		}
		start := time.Now()
		_, err := pool.ExecContext(ctx, query, args...)
		db.Logger.Trace(ctx, start, func() (string, int64) {
			return db.Dialector.Explain(query, args...), int64(n)
		}, err)
		if err != nil {
			return fmt.Errorf("insert into %s: %w", p.cfg.table, err)
		}
		events = events[n:]
	}
	return nil
}

// insertSQL returns INSERT INTO <table> (<columns>) VALUES (...), ... for n rows, in the bind-variable
// syntax of db's dialect. The text is cached per dialect and row count: building it is not free, and
// drivers that cache prepared statements by text (pgx) then reuse the server-side plan.
func (p *Plugin) insertSQL(db *gorm.DB, n int) string {
	shape := insertShape{dialect: db.Dialector.Name(), rows: n}
	p.sqlMu.RLock()
	query, ok := p.sqlCache[shape]
	p.sqlMu.RUnlock()
	if ok {
		return query
	}

	stmt := &gorm.Statement{DB: db}
	var b strings.Builder
	b.WriteString("INSERT INTO ")
	b.WriteString(stmt.Quote(p.cfg.table))
	b.WriteString(" (")
	for i, c := range insertColumns {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(stmt.Quote(c))
	}
	b.WriteString(") VALUES ")
	for r := 0; r < n; r++ {
		if r > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('(')
		for c := range insertColumns {
			if c > 0 {
				b.WriteByte(',')
			}
			stmt.Vars = append(stmt.Vars, nil)
			db.Dialector.BindVarTo(&b, stmt, nil)
		}
		b.WriteByte(')')
	}
	query = b.String()

	p.sqlMu.Lock()
	if len(p.sqlCache) < 256 {
		p.sqlCache[shape] = query
	}
	p.sqlMu.Unlock()
	return query
}
