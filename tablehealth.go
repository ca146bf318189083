package outboxplugin

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"gorm.io/gorm"
)

// TableWarning is something an outbox table lacks (or keeps) that makes the relay or the Admin slower
// than on the table outboxplugin.AutoMigrate makes: what GORM's own
// db.AutoMigrate(&outboxplugin.OutboxEvent{}) leaves out, or an earlier version left behind. The
// table works either way; the warning says what it costs and the one line that fixes it. The worker
// logs each at WARN when it starts, Admin.Stats and Admin.CheckTable return them, and the outbox
// command's status and console show them, all with the same text (String).
//
// Its JSON form (outbox status --json's table_warnings) has code, what, cost and fix, and text, its
// String.
type TableWarning struct {
	// Code identifies the warning for programs; its values are the TableWarning* constants.
	Code TableWarningCode `json:"code"`
	// What names what the table lacks or keeps, and the table.
	What string `json:"what"`
	// Cost is what it costs, as measured by the package's benchmarks.
	Cost string `json:"cost"`
	// Fix is the one line that fixes it.
	Fix string `json:"fix"`
}

// MarshalJSON writes w's fields and its String as text, the line the worker's log and outbox status
// give.
func (w TableWarning) MarshalJSON() ([]byte, error) {
	type fields TableWarning
	return json.Marshal(struct {
		fields
		Text string `json:"text"`
	}{fields(w), w.String()})
}

// TableWarningCode identifies a TableWarning.
type TableWarningCode string

const (
	// TableWarningStorageSettings (PostgreSQL): the table lacks some of the storage settings
	// AutoMigrate gives it (fillfactor and autovacuum thresholds, see pgStorageOptions). GORM's own
	// AutoMigrate sets none of them.
	TableWarningStorageSettings TableWarningCode = "storage_settings"
	// TableWarningReferenceIndex: on PostgreSQL and SQLite the reference index (processed,
	// created_at) WHERE processed = true is missing (GORM's own AutoMigrate does not create it); on
	// MySQL and MariaDB the table still has the full one earlier versions made, which every insert
	// and every mark pays for and nothing needs.
	TableWarningReferenceIndex TableWarningCode = "reference_index"
	// TableWarningDeadIndex (PostgreSQL, SQLite): the dead index (dead_at, id) WHERE dead_at IS NOT
	// NULL is missing, or invalid (PostgreSQL: a CREATE INDEX CONCURRENTLY that failed). GORM's own
	// AutoMigrate does not create it; MySQL and MariaDB have no such index either way.
	TableWarningDeadIndex TableWarningCode = "dead_index"
	// TableWarningLeaseDefaults (MySQL, MariaDB): the lease columns locked_by and locked_until lack
	// the defaults AutoMigrate gives them (32 spaces, 1970-01-01: no lease), so every claim makes its
	// rows longer instead of updating them in place. GORM's own AutoMigrate does not set them, and
	// takes them away again where AutoMigrate set them.
	TableWarningLeaseDefaults TableWarningCode = "lease_defaults"
	// TableWarningPendingIndex (every database): the table still has the pending index (created_at,
	// id) of earlier versions, which GORM's own AutoMigrate does not drop and nothing reads.
	TableWarningPendingIndex TableWarningCode = "pending_index"
)

// String is the warning on one line: what, its cost, and the fix.
func (w TableWarning) String() string {
	return w.What + ": " + w.Cost + ". Fix: " + w.Fix
}

// tableFix is the fix of every TableWarning. AutoMigrate adds what is missing without rewriting the
// table or holding up its writes: on PostgreSQL the storage settings are a catalog change and the
// indexes are built CONCURRENTLY.
const tableFix = "run outboxplugin.AutoMigrate(db) or outbox migrate"

// CheckTable returns what the Admin's table lacks (or keeps) that makes the relay or the Admin slower
// than on a table made by AutoMigrate, in the order of TableWarningCode's constants; none when it is
// as AutoMigrate makes it. It reads the database's catalog only (at most four small queries, and one
// that selects no row to make sure the table is there), never the table's rows, so it costs the same
// on a table of ten million rows as on an empty one. A missing table is an error. Stats returns the
// same list.
func (a *Admin) CheckTable(ctx context.Context) ([]TableWarning, error) {
	fail := func(err error) ([]TableWarning, error) {
		return nil, fmt.Errorf("outboxplugin: check table %s: %w", a.table, err)
	}
	// The catalog reads take a missing table for one that lacks everything.
	rows, err := a.q.DB().QueryContext(ctx, `SELECT 1 FROM `+a.q.Table()+` WHERE 1 = 0`)
	if err != nil {
		return fail(err)
	}
	if err := rows.Close(); err != nil {
		return fail(err)
	}
	warnings, err := checkTable(a.db.WithContext(ctx), a.table)
	if err != nil {
		return fail(err)
	}
	return warnings, nil
}

// checkTable is CheckTable for a *gorm.DB and an unquoted table name; the worker calls it before its
// first claim.
func checkTable(db *gorm.DB, table string) ([]TableWarning, error) {
	var warnings []TableWarning
	missing, err := missingStorageOptions(db, table)
	if err != nil {
		return nil, err
	}
	if len(missing) > 0 {
		warnings = append(warnings, TableWarning{
			Code: TableWarningStorageSettings,
			What: "the outbox table " + table + " lacks the storage settings outboxplugin.AutoMigrate gives it on PostgreSQL (" +
				strings.Join(missing, ", ") + ")",
			Cost: storageSettingsCost(missing),
			Fix:  tableFix,
		})
	}
	index := referenceIndex.name(db.NamingStrategy, table)
	exists, valid, err := indexState(db, table, index)
	if err != nil {
		return nil, fmt.Errorf("look up index %s: %w", index, err)
	}
	switch name := db.Dialector.Name(); {
	case name == dialectMySQL && exists:
		warnings = append(warnings, TableWarning{
			Code: TableWarningReferenceIndex,
			What: "the outbox table " + table + " still has the reference index earlier versions made on MySQL and MariaDB (" +
				index + ": " + referenceIndex.columns + ")",
			Cost: referenceIndexCostMySQL,
			Fix:  tableFix + ", which drops it",
		})
	case name != dialectMySQL && (!exists || !valid):
		state := "has no reference index"
		if exists {
			state = "has an invalid reference index (a failed CREATE INDEX CONCURRENTLY left it)"
		}
		warnings = append(warnings, TableWarning{
			Code: TableWarningReferenceIndex,
			What: "the outbox table " + table + " " + state + " (" + index + ": " + referenceIndex.columns + " WHERE " + referenceIndex.where + ")",
			Cost: referenceIndexCost,
			Fix:  tableFix,
		})
	}
	if name := db.Dialector.Name(); name == "postgres" || name == "sqlite" {
		index := deadIndexName(db, table)
		exists, valid, err := indexState(db, table, index)
		if err != nil {
			return nil, fmt.Errorf("look up index %s: %w", index, err)
		}
		if !exists || !valid {
			state := "has no dead index"
			if exists {
				state = "has an invalid dead index (a failed CREATE INDEX CONCURRENTLY left it)"
			}
			warnings = append(warnings, TableWarning{
				Code: TableWarningDeadIndex,
				What: "the outbox table " + table + " " + state + " (" + index + ": " + deadIndex.columns + " WHERE " + deadIndex.where + ")",
				Cost: deadIndexCost(name),
				Fix:  tableFix,
			})
		}
	}
	if db.Dialector.Name() == dialectMySQL {
		set, err := hasLeaseDefaults(db, table)
		if err != nil {
			return nil, err
		}
		if !set {
			warnings = append(warnings, TableWarning{
				Code: TableWarningLeaseDefaults,
				What: "the outbox table " + table + " lacks the defaults of its lease columns outboxplugin.AutoMigrate gives them on MySQL and MariaDB " +
					"(locked_by " + strconv.Itoa(leaseOwnerWidth) + " spaces, locked_until " + noLeaseUntil + ")",
				Cost: leaseDefaultsCost,
				Fix:  tableFix,
			})
		}
	}
	index = pendingIndex.name(db.NamingStrategy, table)
	exists, _, err = indexState(db, table, index)
	if err != nil {
		return nil, fmt.Errorf("look up index %s: %w", index, err)
	}
	if exists {
		warnings = append(warnings, TableWarning{
			Code: TableWarningPendingIndex,
			What: "the outbox table " + table + " still has the pending index of earlier versions (" + index + ": created_at, id)",
			Cost: pendingIndexCost,
			Fix:  tableFix + ", which drops it",
		})
	}
	return warnings, nil
}

// The costs the warnings quote were measured side by side, interleaved, on one machine:
// docs/benchmarks.md, "Tables made by GORM's own AutoMigrate" (BenchmarkRelayGormTable,
// BenchmarkAdminGormTable, BenchmarkWriteGormTable) and "Claim time with processed rows kept".

// storageSettingsCost is the cost of the missing PostgreSQL storage settings ("name = value").
func storageSettingsCost(missing []string) string {
	var costs []string
	for _, m := range missing {
		if strings.HasPrefix(m, "fillfactor ") {
			costs = append(costs, "a relay drains it at about 0.7 of the speed (0.63 to 0.82 in three side-by-side runs), "+
				"since without room on their pages claims cannot update rows in place")
			break
		}
	}
	for _, m := range missing {
		if strings.HasPrefix(m, "autovacuum_") {
			costs = append(costs, "with the default autovacuum thresholds (a fifth of the table) the dead entries processed events leave "+
				"pile up between vacuums and every claim steps over them (1.5 to 1.7 times as long a claim with 200 000 of them)")
			break
		}
	}
	return strings.Join(costs, "; ")
}

// referenceIndexCost is the cost of the missing reference index on PostgreSQL and SQLite.
const referenceIndexCost = "cleanup and the Admin's reads of processed events (Stats, their lists, Activity, outbox status, the console) " +
	"read the table instead of an index, in time growing with the rows it keeps"

// referenceIndexCostMySQL is the cost of the full reference index on MySQL and MariaDB
// (BenchmarkRelayThroughput and BenchmarkWritePath's plugin_fullindex, docs/benchmarks.md).
const referenceIndexCostMySQL = "every event written adds an entry to it and every event published moves that entry, " +
	"for reads the claim index serves: a relay drains about a tenth slower"

// pendingIndexCost is the cost of the pending index of earlier versions (BenchmarkWriteGormTable).
const pendingIndexCost = "every event written adds an entry to an index nothing reads any more (the claim index replaced it): " +
	"a transaction writing 100 events took up to 1.2 times as long (PostgreSQL, SQLite)"

// leaseDefaultsCost is the cost of lease columns without defaults on MySQL and MariaDB
// (BenchmarkRelayGormTable).
const leaseDefaultsCost = "every claim makes the rows it takes longer (NULL lease columns get values), which InnoDB cannot do in place: " +
	"a relay drains the table at about 0.85 of the speed (0.84 to 0.89 with one or two workers, two runs)"

// deadIndexCost is the cost of the missing dead index on the database (BenchmarkAdminGormTable).
func deadIndexCost(dialect string) string {
	measured := "196 ms instead of 5.4 ms"
	if dialect == "sqlite" {
		measured = "164 ms instead of 60 ms"
	}
	return "the Admin (Stats, the dead events' list and groups, outbox status, the console) reads every row of the table " +
		"to find the dead events, in time growing with the processed rows kept (Stats with 1 000 000 kept: " + measured + ")"
}
