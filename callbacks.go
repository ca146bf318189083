package outboxplugin

import (
	"fmt"

	"gorm.io/gorm"

	"github.com/gorm-outbox/outboxplugin/internal/capture"
)

// The table of callbacks Initialize registers: where the capture (internal/capture, whose
// capturer.go lists its stages) rides on GORM's callback chains.
//
// How the capture rides on GORM's callback chains (callbacks/callbacks.go in gorm):
//
//	create: gorm:begin_transaction, [outbox:begin], gorm:before_create, gorm:save_before_associations,
//	        [outbox:before_create], gorm:create, [outbox:after_create], gorm:save_after_associations,
//	        gorm:after_create, [outbox:commit], gorm:commit_or_rollback_transaction
//	update: ..., [outbox:begin], gorm:setup_reflect_value, ..., [outbox:before_update], gorm:update,
//	        [outbox:after_update], gorm:save_after_associations, gorm:after_update, [outbox:commit], ...
//	delete: ..., [outbox:begin], gorm:before_delete, ..., [outbox:before_delete], gorm:delete,
//	        [outbox:after_delete], gorm:after_delete, [outbox:commit], ...
//
// outbox:before_* decides how the statement's rows will be known and, when GORM's own result does not
// say it, stands in for the statement's connection (internal/capture's write.go) while gorm:create/update/delete runs.
// outbox:after_* classifies what was written and hands its events to db.Statement.ConnPool, which is
// then the transaction GORM opened (or the caller's): that transaction holds them and writes all of its
// events just before it commits (internal/capture's txwatch.go), or, when the plugin does not watch
// it, they are inserted right after the write. A failing hook or association later in the chain rolls
// both back. outbox:begin and outbox:commit open and close a transaction of the plugin's own only when there is none, which happens under SkipDefaultTransaction.
// Associations saved through a parent run chains of their own, nested inside the parent's, and so get
// their own events.
//
// All callbacks are registered with Before: GORM's sorter appends a callback registered After an
// already sorted one at the end of the chain, which would put it past the commit.

const callbackPrefix = "outbox:"

func (p *Plugin) registerCallbacks(db *gorm.DB) error {
	create, update, del := db.Callback().Create(), db.Callback().Update(), db.Callback().Delete()
	for _, err := range []error{
		// Events held by the transaction are written before anything that could see the outbox
		// table without them or end the transaction without them (internal/capture's txwatch.go).
		db.Callback().Raw().Before("gorm:raw").Register(callbackPrefix+"flush", p.c.FlushBeforeExec),
		db.Callback().Query().Before("gorm:query").Register(callbackPrefix+"flush", p.c.FlushBeforeRead),
		db.Callback().Row().Before("gorm:row").Register(callbackPrefix+"flush", p.c.FlushBeforeRead),
		// A transaction the database rolled back whole (a MySQL deadlock) drops its events; these see
		// the errors of statements its connection does not see itself (PrepareStmt's). Registered
		// After, they run last in their chains.
		db.Callback().Raw().After("gorm:raw").Register(callbackPrefix+"observe", p.c.ObserveError),
		db.Callback().Query().After("gorm:query").Register(callbackPrefix+"observe", p.c.ObserveError),
		db.Callback().Row().After("gorm:row").Register(callbackPrefix+"observe", p.c.ObserveError),

		create.Before("gorm:before_create").Register(callbackPrefix+"begin", p.c.Begin(capture.OpCreate)),
		create.Before("gorm:create").Register(callbackPrefix+"before_create", p.c.BeforeCreate),
		create.Before("gorm:save_after_associations").Register(callbackPrefix+"after_create", p.c.AfterCreate),
		create.Before("gorm:commit_or_rollback_transaction").Register(callbackPrefix+"observe", p.c.ObserveError),
		create.Before("gorm:commit_or_rollback_transaction").Register(callbackPrefix+"commit", p.c.CommitOrRollback),

		update.Before("gorm:setup_reflect_value").Register(callbackPrefix+"begin", p.c.Begin(capture.OpUpdate)),
		update.Before("gorm:update").Register(callbackPrefix+"before_update", p.c.BeforeWrite),
		update.Before("gorm:save_after_associations").Register(callbackPrefix+"after_update", p.c.AfterWrite),
		update.Before("gorm:commit_or_rollback_transaction").Register(callbackPrefix+"observe", p.c.ObserveError),
		update.Before("gorm:commit_or_rollback_transaction").Register(callbackPrefix+"commit", p.c.CommitOrRollback),

		del.Before("gorm:before_delete").Register(callbackPrefix+"begin", p.c.Begin(capture.OpDelete)),
		del.Before("gorm:delete").Register(callbackPrefix+"before_delete", p.c.BeforeWrite),
		del.Before("gorm:after_delete").Register(callbackPrefix+"after_delete", p.c.AfterWrite),
		del.Before("gorm:commit_or_rollback_transaction").Register(callbackPrefix+"observe", p.c.ObserveError),
		del.Before("gorm:commit_or_rollback_transaction").Register(callbackPrefix+"commit", p.c.CommitOrRollback),
	} {
		if err != nil {
			return fmt.Errorf("outboxplugin: register callbacks: %w", err)
		}
	}
	return nil
}
