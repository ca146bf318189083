package outboxplugin_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/gorm-outbox/outboxplugin"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// An Admin counts the outbox by state, lists its events and requeues the failed ones; it needs no
// broker.
func ExampleNewAdmin() {
	dir, _ := os.MkdirTemp("", "outbox-example")
	defer os.RemoveAll(dir)
	db, _ := gorm.Open(sqlite.Open(filepath.Join(dir, "app.db")), &gorm.Config{Logger: logger.Discard})
	_ = db.Use(outboxplugin.New())
	_ = outboxplugin.AutoMigrate(db)
	_ = db.Transaction(func(tx *gorm.DB) error {
		return outboxplugin.Emit(tx, "OrderPlaced", map[string]int{"order": 1})
	})

	admin, err := outboxplugin.NewAdmin(db)
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()
	st, _ := admin.Stats(ctx)
	fmt.Printf("%d pending (%d due now), %d dead\n", st.Pending, st.Due, st.Dead)
	page, _ := admin.ListEvents(ctx, outboxplugin.EventFilter{State: outboxplugin.StatePending})
	for _, e := range page.Events {
		fmt.Println(e.EventType, e.State, string(e.Payload))
	}
	// Output:
	// 1 pending (1 due now), 0 dead
	// OrderPlaced due {"order":1}
}

// TableHealth (also Stats.Health) gives the table's size, bloat, upkeep and partitions from the
// database's catalog; a figure the database does not keep is nil, and Alerts lists the thresholds of
// docs/operations.md that the figures cross. On SQLite: the database file's size and free pages.
func ExampleAdmin_TableHealth() {
	dir, _ := os.MkdirTemp("", "outbox-example")
	defer os.RemoveAll(dir)
	db, _ := gorm.Open(sqlite.Open(filepath.Join(dir, "app.db")), &gorm.Config{Logger: logger.Discard})
	_ = db.Use(outboxplugin.New())
	_ = outboxplugin.AutoMigrate(db)

	admin, _ := outboxplugin.NewAdmin(db)
	h, err := admin.TableHealth(context.Background())
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("size known:", h.TotalBytes != nil, "free pages:", *h.FreeBytes, "dead rows known:", h.DeadRows != nil)
	for _, p := range h.Partitions {
		fmt.Println(p.Name, p.Bound, p.Age)
	}
	for _, a := range h.Alerts {
		fmt.Println(a.Code, a.Text)
	}
	// Output:
	// size known: true free pages: 0 dead rows known: false
}
