package tooltest_test

import (
	"fmt"
	"sort"
	"strings"
	"testing"
)

// catalog describes the outbox table of a database as the database sees it: one line per column
// (name, type, nullability, default), per index (its definition, or its columns in order), per
// constraint and storage setting, and per partition (its bounds, and on PostgreSQL its storage). Two
// tables with the same catalog are the same table to the plugin.
func catalog(t *testing.T, d *database, table string) []string {
	t.Helper()
	var lines []string
	query := func(prefix, q string, args ...any) {
		t.Helper()
		rows, err := d.db.Query(q, args...)
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		defer rows.Close()
		cols, err := rows.Columns()
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			vals := make([]sqlText, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				t.Fatal(err)
			}
			parts := make([]string, len(vals))
			for i, v := range vals {
				parts[i] = string(v)
			}
			lines = append(lines, prefix+" "+strings.Join(parts, " | "))
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
	}
	switch d.name {
	case "postgres":
		query("column", `SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, COALESCE(pg_get_expr(ad.adbin, ad.adrelid), '')
			FROM pg_attribute a LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
			WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum`, table)
		query("index", `SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema() AND tablename = $1`, table)
		query("constraint", `SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = to_regclass($1)`, table)
		query("storage", `SELECT COALESCE(array_to_string(reloptions, ','), '') FROM pg_class WHERE oid = to_regclass($1)`, table)
		query("partitioned", `SELECT pg_get_partkeydef(partrelid) FROM pg_partitioned_table WHERE partrelid = to_regclass($1)`, table)
		query("partition", `SELECT c.relname, pg_get_expr(c.relpartbound, c.oid), COALESCE(array_to_string(c.reloptions, ','), '')
			FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass($1)`, table)
	case "mysql":
		query("column", `SELECT column_name, column_type, is_nullable, COALESCE(column_default, 'NULL'), extra
			FROM information_schema.columns WHERE table_schema = DATABASE() AND table_name = ? ORDER BY ordinal_position`, table)
		query("index", `SELECT index_name, GROUP_CONCAT(column_name ORDER BY seq_in_index), non_unique
			FROM information_schema.statistics WHERE table_schema = DATABASE() AND table_name = ? GROUP BY index_name, non_unique`, table)
		query("check", `SELECT constraint_name, check_clause FROM information_schema.check_constraints
			WHERE constraint_schema = DATABASE() AND table_name = ?`, table)
		query("partition", `SELECT partition_name, partition_method, partition_expression, partition_description
			FROM information_schema.partitions WHERE table_schema = DATABASE() AND table_name = ? AND partition_name IS NOT NULL`, table)
	default:
		query("column", `SELECT name, type, "notnull", COALESCE(dflt_value, 'NULL'), pk FROM pragma_table_info(?) ORDER BY cid`, table)
		// SQLite keeps an index's statement as written, less IF NOT EXISTS.
		query("index", `SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = ? AND sql IS NOT NULL`, table)
	}
	sort.Strings(lines)
	if len(lines) == 0 {
		t.Fatalf("no table %s", table)
	}
	return lines
}

// sqlText scans any column as text (NULL as "NULL").
type sqlText string

func (s *sqlText) Scan(src any) error {
	switch v := src.(type) {
	case nil:
		*s = "NULL"
	case []byte:
		*s = sqlText(v)
	default:
		*s = sqlText(fmt.Sprint(v))
	}
	return nil
}
