package outboxplugin

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/gorm-outbox/outboxplugin/internal/sqlname"
)

// TableHealth is the outbox table's size, bloat and upkeep as the database's catalog and statistics
// views give them: what says whether the database keeps up with a table that gets one insert, two
// or more updates and one delete per event. (TableWarning, beside it, is a different thing: what the
// table's schema lacks.) Admin.Stats returns it as Stats.Health, Admin.TableHealth alone, and a
// worker whose Observer is a TableHealthObserver measures it for metrics.
//
// Every figure is the database's own bookkeeping, never a count of the rows, so reading it costs the
// same on ten million rows as on none; estimates are as fresh as the database keeps them. A nil
// pointer is a figure unknown: not kept on this database, or not readable (a view the user may not
// read; Unread says which and why). Which figures each database has:
//
//   - PostgreSQL: TotalBytes (pg_total_relation_size: heap, TOAST, indexes), TableBytes
//     (pg_relation_size: the heap), IndexBytes (pg_indexes_size), LiveRows and DeadRows
//     (pg_stat_user_tables n_live_tup, n_dead_tup), LastVacuum and LastAnalyze (the later of the
//     manual and the automatic one). For a partitioned table each is the sum over its partitions
//     (pg_partition_tree), and LastVacuum and LastAnalyze are the ones the dead rows wait on: the
//     earliest among the partitions that hold dead rows (the latest of all when none does).
//   - MySQL, MariaDB: TableBytes (information_schema.TABLES DATA_LENGTH), IndexBytes (INDEX_LENGTH),
//     TotalBytes (their sum), FreeBytes (DATA_FREE: space allocated to the table and not used, the
//     InnoDB form of bloat), LiveRows (TABLE_ROWS, InnoDB's estimate), PurgeLag (the server's
//     history list length, information_schema.INNODB_METRICS trx_rseg_history_len: undo logs
//     purge has not yet removed; it needs the PROCESS privilege). MySQL 8 caches these figures for
//     information_schema_stats_expiry (a day by default).
//   - SQLite: TotalBytes (page_count × page_size) and FreeBytes (freelist_count × page_size) are
//     those of the whole database file, which holds every table: SQLite tells its tables' sizes
//     apart only by reading all their pages.
//
// Partitions lists the partitions of a partitioned table (PostgreSQL declarative partitioning,
// MySQL/MariaDB RANGE COLUMNS), in bound order, read from the catalog; nil when the table is not
// partitioned. Alerts are the thresholds of docs/operations.md ("Table health") the figures cross.
type TableHealth struct {
	// TotalBytes is the table's whole size on disk (SQLite: the database file's).
	TotalBytes *int64 `json:"total_bytes"`
	// TableBytes is the size of its rows (PostgreSQL's heap, InnoDB's clustered index).
	TableBytes *int64 `json:"table_bytes"`
	// IndexBytes is the size of its secondary indexes.
	IndexBytes *int64 `json:"index_bytes"`
	// FreeBytes is space allocated and not in use: InnoDB's DATA_FREE, SQLite's free pages.
	FreeBytes *int64 `json:"free_bytes"`
	// LiveRows is the database's estimate of the rows (PostgreSQL, MySQL).
	LiveRows *int64 `json:"live_rows"`
	// DeadRows is PostgreSQL's count of dead row versions that VACUUM has not removed yet.
	DeadRows *int64 `json:"dead_rows"`
	// LastVacuum and LastAnalyze (PostgreSQL) are the later of the manual and the automatic one, on
	// the database's clock, UTC; nil when never.
	LastVacuum  *time.Time `json:"last_vacuum"`
	LastAnalyze *time.Time `json:"last_analyze"`
	// PurgeLag is InnoDB's history list length, server-wide (not the table's own).
	PurgeLag *int64 `json:"purge_lag"`
	// Partitions are the table's partitions in range order, the default one last; nil when the
	// table is not partitioned.
	Partitions []PartitionHealth `json:"partitions"`
	// Alerts are the thresholds the figures cross; none when all is well or nothing is known.
	Alerts []HealthAlert `json:"alerts"`
	// Unread names each catalog or statistics read that failed, with its error, and left figures
	// unknown: "pg_stat_user_tables: permission denied …".
	Unread []string `json:"unread"`
}

// MarshalJSON writes h with [] for its empty lists, as Stats does.
func (h TableHealth) MarshalJSON() ([]byte, error) {
	type fields TableHealth
	out := fields(h)
	if out.Partitions == nil {
		out.Partitions = []PartitionHealth{}
	}
	if out.Alerts == nil {
		out.Alerts = []HealthAlert{}
	}
	if out.Unread == nil {
		out.Unread = []string{}
	}
	return json.Marshal(out)
}

// UnmarshalJSON reads what MarshalJSON writes; an empty Partitions list reads back as nil (a table
// that is not partitioned).
func (h *TableHealth) UnmarshalJSON(b []byte) error {
	type fields TableHealth
	var in fields
	if err := json.Unmarshal(b, &in); err != nil {
		return err
	}
	*h = TableHealth(in)
	if len(h.Partitions) == 0 {
		h.Partitions = nil
	}
	if len(h.Alerts) == 0 {
		h.Alerts = nil
	}
	if len(h.Unread) == 0 {
		h.Unread = nil
	}
	return nil
}

// PartitionHealth is one partition of a partitioned outbox table.
//
// Its JSON form has Age in seconds (age_seconds, a float, null when unknown).
type PartitionHealth struct {
	// Name is the partition's name: PostgreSQL's table name (schema-qualified when not in the
	// parent's schema), MySQL's PARTITION_NAME.
	Name string `json:"name"`
	// Bound is the partition's bound as the catalog writes it: PostgreSQL's pg_get_expr(relpartbound)
	// ("FOR VALUES FROM ('…') TO ('…')", "DEFAULT"), MySQL's "VALUES LESS THAN (…)".
	Bound string `json:"bound"`
	// From and To are the range of created_at the partition holds, [From, To), when the bound is a
	// range of times; nil for an open end (MINVALUE, MAXVALUE, the first MySQL partition, which has
	// no lower bound) and for a bound that is not a time. MySQL's DATETIME bounds are read as UTC,
	// the time zone the plugin writes created_at in.
	From *time.Time `json:"from"`
	To   *time.Time `json:"to"`
	// Default is true for the partition that takes the rows no other takes: PostgreSQL's DEFAULT
	// partition, MySQL's VALUES LESS THAN (MAXVALUE). Rows in it mean the partitions were not made
	// ahead of time (an alert).
	Default bool `json:"default"`
	// Age is how old the partition's range is at the reading (Stats.At), from its lower bound: From,
	// or, for MySQL's first partition, which has none in the catalog, its upper bound less the width
	// of the partition after it (partitions of one width, as the plugin makes them, give the exact
	// lower bound); from To when neither is known (all its rows are at least that old). Negative for
	// a partition made ahead. Nil for the default partition and a bound that is not a time.
	Age *time.Duration `json:"-"`
	// TotalBytes and IndexBytes are the partition's size and that of its indexes.
	TotalBytes *int64 `json:"total_bytes"`
	IndexBytes *int64 `json:"index_bytes"`
	// Rows is the database's estimate of the partition's rows (PostgreSQL n_live_tup, MySQL
	// TABLE_ROWS); DeadRows and LastVacuum are PostgreSQL's only, as in TableHealth.
	Rows       *int64     `json:"rows"`
	DeadRows   *int64     `json:"dead_rows"`
	LastVacuum *time.Time `json:"last_vacuum"`
}

type partitionFields PartitionHealth

type partitionJSON struct {
	partitionFields
	AgeSeconds *float64 `json:"age_seconds"`
}

// MarshalJSON writes p with its Age in seconds (age_seconds).
func (p PartitionHealth) MarshalJSON() ([]byte, error) {
	out := partitionJSON{partitionFields: partitionFields(p)}
	if p.Age != nil {
		s := p.Age.Seconds()
		out.AgeSeconds = &s
	}
	return json.Marshal(out)
}

// UnmarshalJSON reads what MarshalJSON writes.
func (p *PartitionHealth) UnmarshalJSON(b []byte) error {
	var in partitionJSON
	if err := json.Unmarshal(b, &in); err != nil {
		return err
	}
	*p = PartitionHealth(in.partitionFields)
	if in.AgeSeconds != nil {
		age := time.Duration(math.Round(*in.AgeSeconds * float64(time.Second)))
		p.Age = &age
	}
	return nil
}

// HealthAlert is a threshold of docs/operations.md ("Table health") that the table's figures cross:
// a starting point for an alert, not a verdict.
type HealthAlert struct {
	Code HealthAlertCode `json:"code"`
	// Text says what was seen, with the figures, and what to do.
	Text string `json:"text"`
}

// HealthAlertCode identifies a HealthAlert.
type HealthAlertCode string

// The thresholds; docs/operations.md gives the reasoning and what to do for each.
const (
	// HealthAlertDeadRows (PostgreSQL): a table or partition holds more dead rows than
	// DeadRowsAlertFraction of its live ones plus DeadRowsAlertMin, and was last vacuumed more than
	// VacuumAlertAge ago (or never): autovacuum is not keeping up.
	HealthAlertDeadRows HealthAlertCode = "dead_rows"
	// HealthAlertFreeSpace (MySQL, MariaDB, SQLite): free space allocated to the table (MySQL
	// DATA_FREE) or to the database file (SQLite's free pages) exceeds the space in use, and
	// FreeSpaceAlertMin.
	HealthAlertFreeSpace HealthAlertCode = "free_space"
	// HealthAlertPurgeLag (MySQL, MariaDB): the history list is longer than PurgeLagAlert: purge is
	// held back, by a long transaction most often.
	HealthAlertPurgeLag HealthAlertCode = "purge_lag"
	// HealthAlertDefaultPartition: the default (PostgreSQL) or MAXVALUE (MySQL) partition holds rows.
	HealthAlertDefaultPartition HealthAlertCode = "default_partition_rows"
)

// The alert thresholds (see HealthAlertCode): starting points from how the table is used (an
// insert, two or more updates and a delete per event), not measured on a production system.
const (
	// DeadRowsAlertFraction and DeadRowsAlertMin: dead rows above this fraction of the live ones
	// plus this many. The table's own autovacuum threshold (AutoMigrate) is 10 000 dead rows.
	DeadRowsAlertFraction = 0.2
	DeadRowsAlertMin      = 10000
	// VacuumAlertAge is how long dead rows above the threshold may wait for a vacuum.
	VacuumAlertAge = time.Hour
	// FreeSpaceAlertMin is the free space below which none is worth an alert: InnoDB keeps a few
	// extents free in any table that grows.
	FreeSpaceAlertMin = 64 << 20
	// PurgeLagAlert is the history list length above which purge is behind.
	PurgeLagAlert = 1000000
)

// TableHealth reads the table's size, bloat and upkeep (see TableHealth). A figure whose view cannot
// be read is left unknown and named in Unread; the error is for a cancelled ctx only.
func (a *Admin) TableHealth(ctx context.Context) (TableHealth, error) {
	h, err := readTableHealth(ctx, a.q.DB(), a.dialect, a.table, a.q.Clock(now()))
	if err != nil {
		return TableHealth{}, fmt.Errorf("outboxplugin: table health of %s: %w", a.table, err)
	}
	return h, nil
}

// readTableHealth reads the health of table (unquoted, as given) at the time at. Each read that
// fails leaves its figures nil and is named in Unread; only ctx's end is an error.
func readTableHealth(ctx context.Context, db *sql.DB, dialect, table string, at time.Time) (TableHealth, error) {
	var h TableHealth
	unread := func(what string, err error) {
		h.Unread = append(h.Unread, what+": "+err.Error())
	}
	switch dialect {
	case dialectPostgres:
		readPostgresHealth(ctx, db, table, at, &h, unread)
	case dialectMySQL:
		readMySQLHealth(ctx, db, table, at, &h, unread)
	default:
		readSQLiteHealth(ctx, db, table, &h, unread)
	}
	if err := ctx.Err(); err != nil {
		return TableHealth{}, err
	}
	h.Alerts = healthAlerts(h, at)
	return h, nil
}

// readPostgresHealth reads one row per leaf of the table's partition tree: the table itself when it
// is not partitioned. pg_partition_tree, the size functions and pg_class need no privilege on the
// table; pg_stat_user_tables shows every table's counters. The sizes are read from each relation's
// files (a stat() per file), the counters from the statistics collector's memory: nothing reads the
// table.
func readPostgresHealth(ctx context.Context, db *sql.DB, table string, at time.Time, h *TableHealth, unread func(string, error)) {
	// The leaves: the table itself when it is not partitioned (pg_partition_tree has no row for a
	// plain table), its leaf partitions when it is (the partitioned table has no storage of its own).
	rows, err := db.QueryContext(ctx, `WITH r AS (SELECT to_regclass($1) AS oid), `+
		`leaves AS (SELECT k.oid FROM r JOIN pg_class k ON k.oid = r.oid WHERE k.relkind <> 'p' `+
		`UNION SELECT t.relid FROM r, pg_partition_tree(r.oid) t WHERE t.isleaf) `+
		`SELECT c.oid <> r.oid, `+
		`CASE WHEN c.relnamespace = p.relnamespace THEN c.relname::text ELSE c.oid::regclass::text END, `+
		`COALESCE(pg_get_expr(c.relpartbound, c.oid), ''), `+
		`pg_total_relation_size(c.oid), COALESCE(pg_relation_size(c.oid), 0), COALESCE(pg_indexes_size(c.oid), 0), `+
		`s.n_live_tup, s.n_dead_tup, GREATEST(s.last_vacuum, s.last_autovacuum), GREATEST(s.last_analyze, s.last_autoanalyze) `+
		`FROM leaves l JOIN pg_class c ON c.oid = l.oid CROSS JOIN r JOIN pg_class p ON p.oid = r.oid `+
		`LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid`, sqlname.PG(table))
	if err != nil {
		unread("pg_partition_tree", err)
		return
	}
	defer rows.Close()
	var (
		total, heap, index, live, dead int64
		leaves                         int
		statsSeen                      bool
		vacuums, analyzes              []pgVacuum
	)
	for rows.Next() {
		var (
			isPartition             bool
			name, bound             string
			size                    sql.NullInt64
			heapSize, indexSize     int64
			nLive, nDead            sql.NullInt64
			lastVacuum, lastAnalyze sql.NullTime
		)
		if err := rows.Scan(&isPartition, &name, &bound, &size, &heapSize, &indexSize, &nLive, &nDead, &lastVacuum, &lastAnalyze); err != nil {
			unread("pg_partition_tree", err)
			h.Partitions = nil
			return
		}
		if !size.Valid {
			// The size functions answer NULL for a relation dropped after the query's snapshot was
			// taken: a partition the relay's cleanup dropped meanwhile. It is gone; leave it out.
			continue
		}
		leaves++
		total, heap, index = total+size.Int64, heap+heapSize, index+indexSize
		if nLive.Valid {
			statsSeen = true
			live, dead = live+nLive.Int64, dead+nDead.Int64
		}
		vacuums = append(vacuums, pgVacuum{nullTime(lastVacuum), nDead.Int64})
		analyzes = append(analyzes, pgVacuum{nullTime(lastAnalyze), nDead.Int64})
		if !isPartition {
			continue
		}
		p := PartitionHealth{Name: name, Bound: bound, Default: bound == "DEFAULT",
			TotalBytes: ptr(size.Int64), IndexBytes: ptr(indexSize), LastVacuum: nullTime(lastVacuum)}
		if nLive.Valid {
			p.Rows, p.DeadRows = ptr(nLive.Int64), ptr(nDead.Int64)
		}
		p.From, p.To = pgRangeBound(bound)
		p.Age = partitionAge(p, at)
		h.Partitions = append(h.Partitions, p)
	}
	if err := rows.Err(); err != nil {
		unread("pg_partition_tree", err)
		h.Partitions = nil
		return
	}
	if leaves == 0 { // to_regclass found no table
		unread("pg_partition_tree", fmt.Errorf("no table %s", table))
		return
	}
	h.TotalBytes, h.TableBytes, h.IndexBytes = ptr(total), ptr(heap), ptr(index)
	if statsSeen {
		h.LiveRows, h.DeadRows = ptr(live), ptr(dead)
		h.LastVacuum, h.LastAnalyze = awaitedVacuum(vacuums), awaitedVacuum(analyzes)
	}
	sortPartitions(h.Partitions)
}

// pgVacuum is a leaf's last vacuum (or analyze) and its dead rows.
type pgVacuum struct {
	at   *time.Time
	dead int64
}

// awaitedVacuum is the vacuum the table's dead rows wait on: the earliest last vacuum among the
// leaves that hold dead rows (nil when one of them was never vacuumed), or the latest of all when
// none holds any.
func awaitedVacuum(leaves []pgVacuum) *time.Time {
	var earliest, latest *time.Time
	withDead := false
	for _, l := range leaves {
		if l.dead > 0 {
			if l.at == nil {
				return nil
			}
			if !withDead || l.at.Before(*earliest) {
				earliest = l.at
			}
			withDead = true
		}
		if l.at != nil && (latest == nil || l.at.After(*latest)) {
			latest = l.at
		}
	}
	if withDead {
		return earliest
	}
	return latest
}

// pgRangeBound reads the times of a range partition's bound as pg_get_expr writes it:
// FOR VALUES FROM ('2026-12-07 01:00:00+01') TO ('2026-12-08 01:00:00+01'), in the session's time
// zone, or MINVALUE/MAXVALUE for an open end. Only the first column of a multi-column key counts.
func pgRangeBound(bound string) (from, to *time.Time) {
	m := pgRange.FindStringSubmatch(bound)
	if m == nil {
		return nil, nil
	}
	return parseBoundTime(m[1]), parseBoundTime(m[2])
}

var pgRange = regexp.MustCompile(`^FOR VALUES FROM \(([^,)]*)[^)]*\) TO \(([^,)]*)[^)]*\)$`)

// parseBoundTime reads one value of a partition bound: a quoted timestamp with or without an offset
// (without one: UTC), or nil for MINVALUE, MAXVALUE and anything else.
func parseBoundTime(v string) *time.Time {
	v = strings.TrimSpace(v)
	if len(v) < 2 || v[0] != '\'' || v[len(v)-1] != '\'' {
		return nil
	}
	v = v[1 : len(v)-1]
	for _, layout := range []string{"2006-01-02 15:04:05.999999999-07", "2006-01-02 15:04:05.999999999-07:00",
		"2006-01-02 15:04:05.999999999", "2006-01-02"} {
		if t, err := time.Parse(layout, v); err == nil {
			t = t.UTC()
			return &t
		}
	}
	return nil
}

// readMySQLHealth reads information_schema.TABLES and PARTITIONS (InnoDB's figures, which the server
// keeps in memory) and the server's history list length.
func readMySQLHealth(ctx context.Context, db *sql.DB, table string, at time.Time, h *TableHealth, unread func(string, error)) {
	schema, name := "", table
	if i := strings.LastIndex(name, "."); i >= 0 {
		schema, name = name[:i], name[i+1:]
	}
	var data, index, free, rows sql.NullInt64
	err := db.QueryRowContext(ctx, `SELECT DATA_LENGTH, INDEX_LENGTH, DATA_FREE, TABLE_ROWS FROM information_schema.TABLES `+
		`WHERE TABLE_SCHEMA = COALESCE(NULLIF(?, ''), DATABASE()) AND TABLE_NAME = ?`, schema, name).Scan(&data, &index, &free, &rows)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		unread("information_schema.TABLES", fmt.Errorf("no table %s", table))
	case err != nil:
		unread("information_schema.TABLES", err)
	default:
		h.TableBytes, h.IndexBytes, h.FreeBytes, h.LiveRows = nullInt(data), nullInt(index), nullInt(free), nullInt(rows)
		if data.Valid && index.Valid {
			h.TotalBytes = ptr(data.Int64 + index.Int64)
		}
	}

	// PARTITIONS has one row with a NULL PARTITION_NAME for a table that is not partitioned.
	parts, err := db.QueryContext(ctx, `SELECT PARTITION_NAME, PARTITION_DESCRIPTION, TABLE_ROWS, DATA_LENGTH, INDEX_LENGTH `+
		`FROM information_schema.PARTITIONS WHERE TABLE_SCHEMA = COALESCE(NULLIF(?, ''), DATABASE()) AND TABLE_NAME = ? `+
		`AND PARTITION_NAME IS NOT NULL AND SUBPARTITION_NAME IS NULL ORDER BY PARTITION_ORDINAL_POSITION`, schema, name)
	if err != nil {
		unread("information_schema.PARTITIONS", err)
	} else {
		var below *time.Time // the previous partition's upper bound: this one's lower bound
		for parts.Next() {
			var (
				pname         string
				desc          sql.NullString
				n, dlen, ilen sql.NullInt64
			)
			if err := parts.Scan(&pname, &desc, &n, &dlen, &ilen); err != nil {
				unread("information_schema.PARTITIONS", err)
				h.Partitions = nil
				break
			}
			p := PartitionHealth{Name: pname, Bound: "VALUES LESS THAN (" + desc.String + ")", Rows: nullInt(n), IndexBytes: nullInt(ilen),
				Default: desc.String == "MAXVALUE", From: below, To: parseBoundTime(desc.String)}
			if dlen.Valid && ilen.Valid {
				p.TotalBytes = ptr(dlen.Int64 + ilen.Int64)
			}
			p.Age = partitionAge(p, at)
			below = p.To
			h.Partitions = append(h.Partitions, p)
		}
		if err := errors.Join(parts.Err(), parts.Close()); err != nil {
			unread("information_schema.PARTITIONS", err)
			h.Partitions = nil
		}
		// The first partition has no lower bound: age it as if it were as wide as the next one.
		if len(h.Partitions) >= 2 && h.Partitions[0].To != nil && h.Partitions[1].From != nil && h.Partitions[1].To != nil {
			age := at.Sub(h.Partitions[0].To.Add(-h.Partitions[1].To.Sub(*h.Partitions[1].From)))
			h.Partitions[0].Age = &age
		}
	}

	// Server-wide; MySQL and MariaDB keep this counter enabled by default. Reading INNODB_METRICS
	// needs the PROCESS privilege.
	var history sql.NullInt64
	err = db.QueryRowContext(ctx, `SELECT COUNT FROM information_schema.INNODB_METRICS WHERE NAME = 'trx_rseg_history_len'`).Scan(&history)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		unread("information_schema.INNODB_METRICS", errors.New("no trx_rseg_history_len"))
	case err != nil:
		unread("information_schema.INNODB_METRICS", err)
	default:
		h.PurgeLag = nullInt(history)
	}
}

// readSQLiteHealth reads the database file's page counts (PRAGMAs that read the file's header).
func readSQLiteHealth(ctx context.Context, db *sql.DB, table string, h *TableHealth, unread func(string, error)) {
	prefix := ""
	if i := strings.LastIndex(table, "."); i >= 0 {
		prefix = sqlname.PGIdent(table[:i]) + "." // SQLite takes PostgreSQL's quotes
	}
	var pages, free, size int64
	for _, r := range []struct {
		pragma string
		into   *int64
	}{{"page_count", &pages}, {"freelist_count", &free}, {"page_size", &size}} {
		if err := db.QueryRowContext(ctx, `PRAGMA `+prefix+r.pragma).Scan(r.into); err != nil {
			unread("PRAGMA "+r.pragma, err)
			return
		}
	}
	h.TotalBytes, h.FreeBytes = ptr(pages*size), ptr(free*size)
}

// partitionAge is the age of p's range at at: from its lower bound, or from its upper bound when it
// has none.
func partitionAge(p PartitionHealth, at time.Time) *time.Duration {
	from := p.From
	if from == nil {
		from = p.To
	}
	if p.Default || from == nil {
		return nil
	}
	age := at.Sub(*from)
	return &age
}

// sortPartitions orders partitions by their range (the default one last), as MySQL lists them.
func sortPartitions(ps []PartitionHealth) {
	key := func(p PartitionHealth) (int, time.Time) {
		switch {
		case p.Default:
			return 3, time.Time{}
		case p.From != nil:
			return 1, *p.From
		case p.To != nil:
			return 0, *p.To // no lower bound: before every bounded one
		}
		return 2, time.Time{}
	}
	slices.SortStableFunc(ps, func(x, y PartitionHealth) int {
		kx, tx := key(x)
		ky, ty := key(y)
		if kx != ky {
			return kx - ky
		}
		return tx.Compare(ty)
	})
}

// healthAlerts are the thresholds h crosses at the time at (see HealthAlertCode).
func healthAlerts(h TableHealth, at time.Time) []HealthAlert {
	var alerts []HealthAlert
	deadRows := func(what string, live, dead *int64, vacuum *time.Time) {
		if live == nil || dead == nil || float64(*dead) <= DeadRowsAlertFraction*float64(*live)+DeadRowsAlertMin {
			return
		}
		since := "never vacuumed"
		if vacuum != nil {
			if at.Sub(*vacuum) <= VacuumAlertAge {
				return
			}
			since = "last vacuumed " + at.Sub(*vacuum).Round(time.Minute).String() + " ago"
		}
		alerts = append(alerts, HealthAlert{Code: HealthAlertDeadRows, Text: fmt.Sprintf(
			"%s has %d dead rows beside %d live ones and was %s: autovacuum is not keeping up with it", what, *dead, *live, since)})
	}
	if len(h.Partitions) == 0 {
		deadRows("the table", h.LiveRows, h.DeadRows, h.LastVacuum)
	}
	for _, p := range h.Partitions {
		deadRows("partition "+p.Name, p.Rows, p.DeadRows, p.LastVacuum)
	}
	if h.FreeBytes != nil && *h.FreeBytes > FreeSpaceAlertMin {
		used := int64(-1)
		switch {
		case h.TableBytes != nil && h.IndexBytes != nil:
			used = *h.TableBytes + *h.IndexBytes
		case h.TotalBytes != nil: // SQLite: the file, free pages included
			used = *h.TotalBytes - *h.FreeBytes
		}
		if used >= 0 && *h.FreeBytes > used {
			alerts = append(alerts, HealthAlert{Code: HealthAlertFreeSpace, Text: fmt.Sprintf(
				"%d bytes are allocated and free beside %d in use: the space of deleted events is not reused", *h.FreeBytes, used)})
		}
	}
	if h.PurgeLag != nil && *h.PurgeLag > PurgeLagAlert {
		alerts = append(alerts, HealthAlert{Code: HealthAlertPurgeLag, Text: fmt.Sprintf(
			"the server's history list holds %d undo logs: purge is held back, most often by a long-running transaction", *h.PurgeLag)})
	}
	for _, p := range h.Partitions {
		if p.Default && p.Rows != nil && *p.Rows > 0 {
			alerts = append(alerts, HealthAlert{Code: HealthAlertDefaultPartition, Text: fmt.Sprintf(
				"the default partition %s holds rows (about %d, the database's estimate): partitions were not made ahead of time", p.Name, *p.Rows)})
		}
	}
	return alerts
}

func ptr[T any](v T) *T { return &v }

func nullInt(v sql.NullInt64) *int64 {
	if !v.Valid {
		return nil
	}
	return &v.Int64
}

func nullTime(v sql.NullTime) *time.Time {
	if !v.Valid {
		return nil
	}
	t := v.Time.UTC()
	return &t
}
