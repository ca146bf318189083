// Package partition is the partitioned outbox table's own SQL (PostgreSQL and MySQL/MariaDB): reading
// a table's partitions from the catalog, making the partitions of the coming intervals ahead of time,
// and retiring the ones past the retention by dropping them whole, never one that holds an unfinished
// event. The root package's AutoMigrate uses it to make a new table's first partitions (and those an
// existing table lacks); the relay's maintenance (internal/relay's Cleanup) to keep them coming and
// going. It knows nothing of the capture or the relay.
//
// The layout it manages: the table partitioned by RANGE of created_at (PostgreSQL: PARTITION BY RANGE
// (created_at), a primary key (id, created_at), a DEFAULT partition; MySQL/MariaDB: PARTITION BY RANGE
// COLUMNS(created_at), the same key, a last partition VALUES LESS THAN (MAXVALUE)), in partitions of
// equal width aligned on the Unix epoch in UTC (a day's partitions start at midnight UTC), named after
// their first instant: <table>_p20261207 on PostgreSQL (a table of its own, beside the parent),
// p20261207 on MySQL (a partition of the table), with the hour after the day (p2026120714) when the
// width is not a whole number of days. The DEFAULT and MAXVALUE partitions catch what no partition
// covers: a write never fails for a missing partition; a row there is an alert.
package partition

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Dialects, as GORM's dialectors name themselves.
const (
	Postgres = "postgres"
	MySQL    = "mysql"
)

// DefaultEvery is the width of a partition unless told otherwise: a day.
const DefaultEvery = 24 * time.Hour

// Ahead is how many partitions after the current interval's are kept made: with daily partitions,
// today's and the next two days'. A relay that stops for less than that leaves no write to the
// default partition.
const Ahead = 2

// Partition is one partition of a table.
type Partition struct {
	// Name is the partition's table (PostgreSQL, without its schema, which is the parent's) or the
	// partition's name (MySQL).
	Name string
	// From and To bound the created_at the partition holds, From included, To not. On MySQL a
	// partition holds everything below To that the partitions before it do not: the first one's From
	// is zero. Both are zero for the default partition, and for a bound that is no time (MINVALUE).
	From, To time.Time
	// Default: PostgreSQL's DEFAULT partition, MySQL's VALUES LESS THAN (MAXVALUE) one.
	Default bool
}

// Querier runs the catalog reads and the checks: a *sql.DB, *sql.Conn or *sql.Tx.
type Querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// Execer also runs the DDL.
type Execer interface {
	Querier
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// ErrNotManaged: the table is partitioned, but not by RANGE of created_at as this package makes it;
// its maintenance is left to its owner.
var ErrNotManaged = errors.New("the table is partitioned, but not by range of created_at")

// Table is a partitioned outbox table on one database.
type Table struct {
	Dialect string
	// Schema is the table's schema ("" for the connection's own), Name its name, both unquoted.
	Schema, Name string
}

// NewTable splits a validated, possibly schema-qualified name.
func NewTable(dialect, qualified string) Table {
	t := Table{Dialect: dialect, Name: qualified}
	if i := strings.LastIndex(qualified, "."); i >= 0 {
		t.Schema, t.Name = qualified[:i], qualified[i+1:]
	}
	return t
}

// quote quotes a name that sqlname.Valid accepted.
func (t Table) quote(name string) string {
	if t.Dialect == Postgres {
		return `"` + name + `"`
	}
	return "`" + name + "`"
}

// Quoted is the table's name, quoted and qualified.
func (t Table) Quoted() string { return t.qualify(t.Name) }

// qualify names a table of t's schema (PostgreSQL: a partition's own table).
func (t Table) qualify(name string) string {
	if t.Schema == "" {
		return t.quote(name)
	}
	return t.quote(t.Schema) + "." + t.quote(name)
}

// maxPGName is PostgreSQL's longest identifier: a longer one is cut short, silently.
const maxPGName = 63

// Check reports a table whose partitions' names would not fit: PostgreSQL cuts a name longer than 63
// bytes short, and two partitions' names would then be the same.
func (t Table) Check() error {
	if t.Dialect == Postgres && len(t.Name)+len("_p2026120714") > maxPGName {
		return fmt.Errorf("the table's name %q is too long for its partitions' names (%d bytes at most)", t.Name, maxPGName-len("_p2026120714"))
	}
	return nil
}

// CheckEvery reports a width this package cannot make partitions of: it must be a whole number of
// hours, at least one.
func CheckEvery(every time.Duration) error {
	if every < time.Hour || every%time.Hour != 0 {
		return fmt.Errorf("a partition's width must be a whole number of hours, at least one: %v", every)
	}
	return nil
}

// Floor is the start of the interval of width every (aligned on the Unix epoch) that holds t, in UTC.
func Floor(t time.Time, every time.Duration) time.Time {
	e := int64(every / time.Second)
	s := t.Unix()
	s -= ((s % e) + e) % e
	return time.Unix(s, 0).UTC()
}

// name is the partition that starts at from.
func (t Table) name(from time.Time, every time.Duration) string {
	layout := "20060102"
	if every%(24*time.Hour) != 0 {
		layout = "2006010215"
	}
	if t.Dialect == Postgres {
		return t.Name + "_p" + from.UTC().Format(layout)
	}
	return "p" + from.UTC().Format(layout)
}

// defaultName is the default partition's (PostgreSQL: its table's) name.
func (t Table) defaultName() string {
	if t.Dialect == Postgres {
		return t.Name + "_default"
	}
	return "pmax"
}

// literal writes a bound: a UTC time, as the column compares it.
func (t Table) literal(at time.Time) string {
	if t.Dialect == Postgres {
		return "'" + at.UTC().Format("2006-01-02 15:04:05") + "+00'"
	}
	return "'" + at.UTC().Format("2006-01-02 15:04:05") + "'"
}

// PartitionBy is the clause of a new table's CREATE TABLE that partitions it, with, on MySQL, the
// partitions of the intervals from the one that holds now and Ahead more, and the MAXVALUE partition.
func (t Table) PartitionBy(now time.Time, every time.Duration) string {
	if t.Dialect == Postgres {
		return "PARTITION BY RANGE (created_at)"
	}
	return "PARTITION BY RANGE COLUMNS(created_at) (\n" + t.mysqlPartitions(slots(now, every), every) + "\n)"
}

// slots are the starts of the intervals a table needs made at now: the current one and Ahead more.
func slots(now time.Time, every time.Duration) []time.Time {
	first := Floor(now, every)
	out := make([]time.Time, 0, Ahead+1)
	for i := 0; i <= Ahead; i++ {
		out = append(out, first.Add(time.Duration(i)*every))
	}
	return out
}

// NewPartitions are the statements that make a new PostgreSQL table's partitions, after its CREATE
// TABLE: the default one and those of the intervals from the one that holds now and Ahead more, each
// with the storage settings given ("name = value"; PostgreSQL keeps none on the partitioned table
// itself). MySQL's are in its CREATE TABLE (PartitionBy).
func (t Table) NewPartitions(now time.Time, every time.Duration, storage []string) []string {
	if t.Dialect != Postgres {
		return nil
	}
	with := ""
	if len(storage) > 0 {
		with = " WITH (" + strings.Join(storage, ", ") + ")"
	}
	out := []string{"CREATE TABLE IF NOT EXISTS " + t.qualify(t.defaultName()) + " PARTITION OF " + t.Quoted() + " DEFAULT" + with}
	for _, s := range slots(now, every) {
		out = append(out, "CREATE TABLE IF NOT EXISTS "+t.qualify(t.name(s, every))+" PARTITION OF "+t.Quoted()+
			" FOR VALUES FROM ("+t.literal(s)+") TO ("+t.literal(s.Add(every))+")"+with)
	}
	return out
}

// Layout is what the catalog says of a table: whether it is partitioned, and how.
type Layout struct {
	// Partitioned: the table is partitioned by range of created_at (ErrNotManaged when it is
	// partitioned otherwise).
	Partitioned bool
	// Partitions are its partitions, the default one last, the others by their bounds.
	Partitions []Partition
	// Every is the width of its newest partition: the width of the partitions to come (zero when it
	// has none but the default).
	Every time.Duration
	// Storage is the newest partition's storage settings (PostgreSQL), to give the next ones.
	Storage []string
}

// Read reads t's layout from the catalog. A table that does not exist reads as not partitioned.
func (t Table) Read(ctx context.Context, q Querier) (Layout, error) {
	var l Layout
	var err error
	if t.Dialect == Postgres {
		err = t.readPG(ctx, q, &l)
	} else {
		err = t.readMySQL(ctx, q, &l)
	}
	if err != nil || !l.Partitioned {
		return l, err
	}
	var dflt []Partition
	var ranged []Partition
	for _, p := range l.Partitions {
		if p.Default {
			dflt = append(dflt, p)
		} else {
			ranged = append(ranged, p)
		}
	}
	sortByTo(ranged)
	l.Partitions = append(ranged, dflt...)
	if n := len(ranged); n > 0 && !ranged[n-1].From.IsZero() {
		l.Every = ranged[n-1].To.Sub(ranged[n-1].From)
	}
	return l, nil
}

func sortByTo(ps []Partition) {
	for i := 1; i < len(ps); i++ {
		for j := i; j > 0 && ps[j].To.Before(ps[j-1].To); j-- {
			ps[j], ps[j-1] = ps[j-1], ps[j]
		}
	}
}

func (t Table) readPG(ctx context.Context, q Querier, l *Layout) error {
	var kind, key sql.NullString
	// No row (no such table) leaves kind empty: not partitioned.
	if err := queryRow(ctx, q, `SELECT c.relkind::text, CASE WHEN c.relkind = 'p' THEN pg_get_partkeydef(c.oid) END`+
		` FROM pg_class c WHERE c.oid = to_regclass($1)`, []any{t.Quoted()}, &kind, &key); err != nil || kind.String != "p" {
		return err
	}
	if key.String != "RANGE (created_at)" {
		return fmt.Errorf("%w (%s)", ErrNotManaged, key.String)
	}
	l.Partitioned = true
	// The bounds as the catalog writes them, in UTC whatever the session's zone: pg_get_expr
	// writes a timestamptz in the session's. pg_get_expr is called once per row and its text taken
	// apart here: it reads the partition from the catalog cache, not from the query's snapshot, so a
	// partition another session dropped after the query's snapshot was taken answers NULL (a relay's
	// cleanup beside another's turn, or beside Stats). Such a partition is gone and is left out.
	rows, err := q.QueryContext(ctx, `SELECT c.relname::text, pg_get_expr(c.relpartbound, c.oid),`+
		` COALESCE(array_to_string(c.reloptions, ','), '')`+
		` FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass($1)`, t.Quoted())
	if err != nil {
		return err
	}
	defer rows.Close()
	var newest time.Time
	for rows.Next() {
		var p Partition
		var bound sql.NullString
		var options string
		if err := rows.Scan(&p.Name, &bound, &options); err != nil {
			return err
		}
		if !bound.Valid {
			continue
		}
		from, to, def, ok := splitPGBound(bound.String)
		if !ok {
			return fmt.Errorf("partition %s: unreadable bound %q", p.Name, bound.String)
		}
		p.Default = def
		if !p.Default {
			if p.From, err = parsePGBound(from); err != nil {
				return fmt.Errorf("partition %s: %w", p.Name, err)
			}
			if p.To, err = parsePGBound(to); err != nil {
				return fmt.Errorf("partition %s: %w", p.Name, err)
			}
			if !p.To.Before(newest) && !p.To.IsZero() {
				newest = p.To
				l.Storage = nil
				if options != "" {
					for _, o := range strings.Split(options, ",") {
						name, value, _ := strings.Cut(o, "=")
						l.Storage = append(l.Storage, name+" = "+value)
					}
				}
			}
		}
		l.Partitions = append(l.Partitions, p)
	}
	return rows.Err()
}

// splitPGBound takes apart a range partition's bound as pg_get_expr writes it: "DEFAULT", or
// "FOR VALUES FROM ('2026-12-07 00:00:00+00') TO ('2026-12-08 00:00:00+00')", with MINVALUE or
// MAXVALUE (returned as "") for an open end.
func splitPGBound(bound string) (from, to string, def, ok bool) {
	if bound == "DEFAULT" {
		return "", "", true, true
	}
	m := pgBound.FindStringSubmatch(bound)
	if m == nil {
		return "", "", false, false
	}
	return m[1], m[2], false, true
}

var pgBound = regexp.MustCompile(`^FOR VALUES FROM \((?:'([^']*)'|MINVALUE)\) TO \((?:'([^']*)'|MAXVALUE)\)$`)

// parsePGBound reads a timestamptz bound as pg_get_expr writes it ("2026-12-07 00:00:00+00",
// "2026-12-07 05:30:00+05:30", with a fraction when it has one); "" (MINVALUE, MAXVALUE) is zero.
func parsePGBound(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	for _, layout := range []string{"2006-01-02 15:04:05.999999999Z07", "2006-01-02 15:04:05.999999999Z07:00", "2006-01-02 15:04:05.999999999Z07:00:00"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t.UTC(), nil
		}
	}
	return time.Time{}, fmt.Errorf("unreadable bound %q", s)
}

func (t Table) readMySQL(ctx context.Context, q Querier, l *Layout) error {
	rows, err := q.QueryContext(ctx, `SELECT partition_name, COALESCE(partition_method, ''), COALESCE(partition_expression, ''), COALESCE(partition_description, '')`+
		` FROM information_schema.partitions WHERE table_schema = COALESCE(NULLIF(?, ''), DATABASE()) AND table_name = ?`+
		` AND partition_name IS NOT NULL ORDER BY partition_ordinal_position`, t.Schema, t.Name)
	if err != nil {
		return err
	}
	defer rows.Close()
	var prev time.Time
	for rows.Next() {
		var p Partition
		var method, expr, desc string
		if err := rows.Scan(&p.Name, &method, &expr, &desc); err != nil {
			return err
		}
		if method != "RANGE COLUMNS" || strings.Trim(expr, "`") != "created_at" {
			return fmt.Errorf("%w (%s %s)", ErrNotManaged, method, expr)
		}
		l.Partitioned = true
		if desc == "MAXVALUE" {
			p.Default = true
		} else {
			to, err := time.Parse("2006-01-02 15:04:05.999999", strings.Trim(desc, "'"))
			if err != nil {
				return fmt.Errorf("partition %s: unreadable bound %q", p.Name, desc)
			}
			p.From, p.To = prev, to.UTC()
			prev = p.To
		}
		l.Partitions = append(l.Partitions, p)
	}
	return rows.Err()
}

// Default is the layout's default partition, if it has one.
func (l Layout) Default() (Partition, bool) {
	for _, p := range l.Partitions {
		if p.Default {
			return p, true
		}
	}
	return Partition{}, false
}

// has reports whether l still has range partition p, with its bounds.
func (l Layout) has(p Partition) bool {
	for _, q := range l.Partitions {
		if q.Name == p.Name && q.To.Equal(p.To) && !q.Default {
			return true
		}
	}
	return false
}

// covered reports whether a partition other than the default holds created_at at.
func (l Layout) covered(at time.Time) bool {
	for _, p := range l.Partitions {
		if !p.Default && !at.Before(p.From) && at.Before(p.To) {
			return true
		}
	}
	return false
}

// last is the end of the newest partition other than the default (zero when there is none).
func (l Layout) last() time.Time {
	var end time.Time
	for _, p := range l.Partitions {
		if !p.Default && p.To.After(end) {
			end = p.To
		}
	}
	return end
}

// Step is one piece of DDL that makes a partition: it runs on its own.
type Step struct {
	Partitions []string // those it makes
	SQL        []string // run in order, in one transaction on PostgreSQL
}

// Plan returns the steps that make the partitions t lacks at now: the current interval's and Ahead
// more, of the layout's width. On PostgreSQL a partition is a table of its own made like the parent
// and attached (which, unlike CREATE TABLE … PARTITION OF, lets the application's writes go on), and a
// range that the default partition holds rows of is left out (attaching it would fail): skipped names
// them. On MySQL the MAXVALUE partition is split, rows and all, into the partitions after the newest
// (a RANGE's partitions follow each other; there is no gap to fill).
func (t Table) Plan(ctx context.Context, q Querier, l Layout, now time.Time) (steps []Step, skipped []string, err error) {
	every := l.Every
	if every <= 0 {
		every = DefaultEvery
	}
	if t.Dialect == MySQL {
		var starts []time.Time
		last := l.last()
		end := Floor(now, every).Add(time.Duration(Ahead+1) * every)
		for s := last; !last.IsZero() && s.Before(end); s = s.Add(every) {
			starts = append(starts, s)
		}
		if len(starts) == 0 {
			return nil, nil, nil
		}
		names := make([]string, len(starts))
		for i, s := range starts {
			names[i] = t.name(s, every)
		}
		if _, ok := l.Default(); !ok {
			var b strings.Builder
			for i, s := range starts {
				if i > 0 {
					b.WriteString(", ")
				}
				fmt.Fprintf(&b, "PARTITION %s VALUES LESS THAN (%s)", t.quote(t.name(s, every)), t.literal(s.Add(every)))
			}
			return []Step{{Partitions: names, SQL: []string{"ALTER TABLE " + t.Quoted() + " ADD PARTITION (" + b.String() + ")"}}}, nil, nil
		}
		// starts are consecutive from the newest partition's end; the last one ends at end.
		return []Step{{Partitions: names, SQL: []string{"ALTER TABLE " + t.Quoted() + " REORGANIZE PARTITION " +
			t.quote(t.defaultName()) + " INTO (\n" + t.mysqlPartitions(starts, every) + "\n)"}}}, nil, nil
	}
	dflt, hasDefault := l.Default()
	with := ""
	if len(l.Storage) > 0 {
		with = " WITH (" + strings.Join(l.Storage, ", ") + ")"
	}
	for _, s := range slots(now, every) {
		if l.covered(s) || l.overlaps(s, s.Add(every)) {
			continue
		}
		name := t.name(s, every)
		if hasDefault {
			var held bool
			if err := queryRow(ctx, q, `SELECT EXISTS (SELECT 1 FROM ONLY `+t.qualify(dflt.Name)+` WHERE created_at >= $1 AND created_at < $2)`,
				[]any{s, s.Add(every)}, &held); err != nil {
				return nil, nil, err
			}
			if held {
				skipped = append(skipped, name)
				continue
			}
		}
		steps = append(steps, Step{Partitions: []string{name}, SQL: []string{
			"CREATE TABLE IF NOT EXISTS " + t.qualify(name) + " (LIKE " + t.Quoted() + " INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE)" + with,
			"ALTER TABLE " + t.Quoted() + " ATTACH PARTITION " + t.qualify(name) + " FOR VALUES FROM (" + t.literal(s) + ") TO (" + t.literal(s.Add(every)) + ")",
		}})
	}
	return steps, skipped, nil
}

// mysqlPartitions lists the partitions that start at starts, each every wide, and the MAXVALUE one
// after them, as CREATE TABLE and REORGANIZE PARTITION take them.
func (t Table) mysqlPartitions(starts []time.Time, every time.Duration) string {
	var b strings.Builder
	for _, s := range starts {
		fmt.Fprintf(&b, "\tPARTITION %s VALUES LESS THAN (%s),\n", t.quote(t.name(s, every)), t.literal(s.Add(every)))
	}
	b.WriteString("\tPARTITION " + t.quote(t.defaultName()) + " VALUES LESS THAN (MAXVALUE)")
	return b.String()
}

// overlaps reports whether a partition other than the default holds part of [from, to).
func (l Layout) overlaps(from, to time.Time) bool {
	for _, p := range l.Partitions {
		if !p.Default && p.From.Before(to) && from.Before(p.To) {
			return true
		}
	}
	return false
}

// Unfinished counts, up to limit each, the events of partition p that are pending (scheduled,
// leased and waiting included) and dead: what a drop must never remove.
func (t Table) Unfinished(ctx context.Context, q Querier, p Partition, limit int) (pending, dead int64, err error) {
	from := t.partitionRef(p)
	lim := strconv.Itoa(limit)
	// Each read in the order of the index that holds its rows, so that the planner reads that index
	// whatever its statistics say: a partition nobody has analysed yet, whose every row is processed,
	// was read whole (a sequential scan that expected to meet a dead row soon) — most of a drop's
	// time. The pending rows are the head of the claim index (processed, dead_at, next_attempt_at,
	// created_at, id); the dead ones PostgreSQL's dead index (dead_at, id), and on MySQL, which has
	// none, the claim index's run of unprocessed rows with a dead_at.
	deadRun := `WHERE dead_at IS NOT NULL ORDER BY dead_at, id`
	if t.Dialect != Postgres {
		deadRun = `WHERE processed = false AND dead_at IS NOT NULL ORDER BY processed, dead_at`
	}
	err = queryRow(ctx, q, `SELECT (SELECT COUNT(*) FROM (SELECT 1 FROM `+from+` WHERE processed = false AND dead_at IS NULL`+
		` ORDER BY processed, dead_at, next_attempt_at, created_at, id LIMIT `+lim+`) a),`+
		` (SELECT COUNT(*) FROM (SELECT 1 FROM `+from+` `+deadRun+` LIMIT `+lim+`) b)`, nil, &pending, &dead)
	return pending, dead, err
}

// partitionRef names partition p's rows in a FROM clause.
func (t Table) partitionRef(p Partition) string {
	if t.Dialect == Postgres {
		return "ONLY " + t.qualify(p.Name)
	}
	return t.Quoted() + " PARTITION (" + t.quote(p.Name) + ")"
}

// Rows counts, up to limit, the rows of partition p.
func (t Table) Rows(ctx context.Context, q Querier, p Partition, limit int) (int64, error) {
	var n int64
	err := queryRow(ctx, q, `SELECT COUNT(*) FROM (SELECT 1 FROM `+t.partitionRef(p)+` LIMIT `+strconv.Itoa(limit)+`) r`, nil, &n)
	return n, err
}

// queryRow scans the one row query returns into dest (which stays as it is when there is none):
// QueryRowContext's, for a Querier, which has only QueryContext.
func queryRow(ctx context.Context, q Querier, query string, args []any, dest ...any) error {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	if rows.Next() {
		if err := rows.Scan(dest...); err != nil {
			return err
		}
	}
	return rows.Err()
}
