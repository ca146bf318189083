package inbox_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outboxplugin/inbox"
)

// Message ids and consumer names that differ only in case, accents or trailing spaces are different
// messages and different consumers on every database: each is handled once, none is skipped as the
// other's redelivery.
func TestIDsComparedExactly(t *testing.T) {
	forEachDB(t, func(t *testing.T, db *gorm.DB) {
		in := newInbox(t, db)
		ctx := context.Background()
		ids := []string{"AbC-1", "abc-1", "ABC-1", "abc-1 ", "abc-1  ", "ábc-1", "abc-1\t"}
		consumers := []string{"billing", "Billing", "billing "}
		for _, c := range consumers {
			for _, id := range ids {
				ran, err := in.Handle(ctx, c, id, createInvoice(c+"|"+id))
				require.NoError(t, err)
				assert.True(t, ran, "%q/%q is a message of its own", c, id)
			}
		}
		for _, c := range consumers {
			for _, id := range ids {
				ran, err := in.Handle(ctx, c, id, createInvoice(c+"|"+id))
				require.NoError(t, err)
				assert.False(t, ran, "%q/%q redelivered", c, id)
			}
		}
		var recs []inbox.Record
		require.NoError(t, db.Table(inbox.DefaultTableName).Find(&recs).Error)
		assert.Len(t, recs, len(ids)*len(consumers))
		for _, r := range recs {
			assert.EqualValues(t, 1, invoices(t, db, r.Consumer+"|"+r.MessageID), "%q/%q stored as sent", r.Consumer, r.MessageID)
		}
	})
}

// A table made before ids were compared exactly — by GORM's migrator from Record, as AutoMigrate made
// it, which on MySQL and MariaDB compares by the database's default collation — keeps working: a
// redelivery is still skipped, and an id the table takes for another is an error, never skipped as
// handled. AutoMigrate converts it, keeping its records; afterwards the two ids are two messages and
// it has nothing left to do.
func TestAutoMigrateUpgradesInexactTable(t *testing.T) {
	forEachDB(t, func(t *testing.T, db *gorm.DB) {
		ctx := context.Background()
		require.NoError(t, db.Table(inbox.DefaultTableName).AutoMigrate(&inbox.Record{}))
		require.NoError(t, db.AutoMigrate(&Invoice{}))
		in, err := inbox.New(db)
		require.NoError(t, err)

		ran, err := in.Handle(ctx, "billing", "AbC-1", createInvoice("AbC-1"))
		require.NoError(t, err)
		require.True(t, ran)
		ran, err = in.Handle(ctx, "billing", "AbC-1", createInvoice("AbC-1"))
		require.NoError(t, err)
		assert.False(t, ran, "a redelivery on the old table")

		plan, err := in.PlanMigration(ctx)
		require.NoError(t, err)
		inexact := db.Dialector.Name() == "mysql"
		if inexact {
			ran, err = in.Handle(ctx, "billing", "abc-1", createInvoice("abc-1"))
			assert.ErrorIs(t, err, inbox.ErrInexactTable, "not skipped as handled")
			assert.False(t, ran)
			assert.EqualValues(t, 0, invoices(t, db, "abc-1"))
			require.Len(t, plan, 1)
			assert.Contains(t, plan[0], "varbinary")
		} else {
			assert.Empty(t, plan, "exact already")
		}

		require.NoError(t, in.AutoMigrate(ctx))
		plan, err = in.PlanMigration(ctx)
		require.NoError(t, err)
		assert.Empty(t, plan, "up to date")
		ran, err = in.Handle(ctx, "billing", "AbC-1", createInvoice("AbC-1"))
		require.NoError(t, err)
		assert.False(t, ran, "the record of the old table is kept")
		ran, err = in.Handle(ctx, "billing", "abc-1", createInvoice("abc-1"))
		require.NoError(t, err)
		assert.True(t, ran)
		assert.EqualValues(t, 1, invoices(t, db, "AbC-1"))
		assert.EqualValues(t, 1, invoices(t, db, "abc-1"))
	})
}

// AutoMigrate makes a table that needs nothing more, adds the handled_at index to a table without it,
// and on a table up to date runs nothing.
func TestAutoMigrateUpToDate(t *testing.T) {
	forEachDB(t, func(t *testing.T, db *gorm.DB) {
		ctx := context.Background()
		in, err := inbox.New(db, inbox.WithTable("consumer_inbox"))
		require.NoError(t, err)
		plan, err := in.PlanMigration(ctx)
		require.NoError(t, err)
		assert.NotEmpty(t, plan, "a new table")
		require.NoError(t, in.AutoMigrate(ctx))
		require.NoError(t, in.AutoMigrate(ctx), "twice")
		plan, err = in.PlanMigration(ctx)
		require.NoError(t, err)
		assert.Empty(t, plan)

		require.NoError(t, db.Migrator().DropIndex("consumer_inbox", "idx_consumer_inbox_handled_at"))
		plan, err = in.PlanMigration(ctx)
		require.NoError(t, err)
		require.Len(t, plan, 1)
		assert.Contains(t, plan[0], "handled_at")
		require.NoError(t, in.AutoMigrate(ctx))
		assert.True(t, db.Migrator().HasIndex("consumer_inbox", "idx_consumer_inbox_handled_at"))
		plan, err = in.PlanMigration(ctx)
		require.NoError(t, err)
		assert.Empty(t, plan)
	})
}

// Keys a database cannot store as they are — a NUL byte, bytes that are not UTF-8 — are refused on
// every database alike, before anything is written.
func TestHandleRefusesKeysNotStoredExactly(t *testing.T) {
	forEachDB(t, func(t *testing.T, db *gorm.DB) {
		in := newInbox(t, db)
		for _, c := range []struct{ consumer, id string }{
			{"billing", "m\x00-1"}, {"bill\x00ing", "m-1"}, {"billing", "m-\xff"}, {"billing", strings.Repeat("a", 10) + "\xc3"},
		} {
			ran, err := in.Handle(context.Background(), c.consumer, c.id, func(*gorm.DB) error {
				t.Errorf("the handler ran for %q/%q", c.consumer, c.id)
				return nil
			})
			assert.False(t, ran)
			assert.ErrorIs(t, err, inbox.ErrInvalidKey, "%q/%q", c.consumer, c.id)
		}
	})
}
