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

type exampleUser struct {
	ID   uint
	Name string
}

// openExampleDB opens a SQLite database in a temporary directory with the plugin registered and
// the tables migrated; close removes it.
func openExampleDB() (db *gorm.DB, close func()) {
	dir, _ := os.MkdirTemp("", "outbox-example")
	db, _ = gorm.Open(sqlite.Open(filepath.Join(dir, "app.db")), &gorm.Config{Logger: logger.Discard})
	_ = db.Use(outboxplugin.New())
	_ = db.AutoMigrate(&exampleUser{})
	_ = outboxplugin.AutoMigrate(db)
	return db, func() { os.RemoveAll(dir) }
}

// Registered on a *gorm.DB, the plugin writes an outbox event for every row a create, update or
// delete changes, in the same transaction; a rolled-back transaction leaves none.
func ExampleNew() {
	db, done := openExampleDB() // db.Use(outboxplugin.New()) inside
	defer done()

	u := exampleUser{Name: "ann"}
	db.Create(&u)
	db.Model(&u).Update("name", "Ann")
	_ = db.Transaction(func(tx *gorm.DB) error {
		tx.Create(&exampleUser{Name: "ghost"})
		return fmt.Errorf("changed my mind") // rolled back: no row, no event
	})

	var events []outboxplugin.OutboxEvent
	db.Order("id").Find(&events)
	for _, e := range events {
		fmt.Println(e.EventType, e.AggregateType, e.AggregateID, string(e.Payload))
	}
	// Output:
	// exampleUser_create exampleUser 1 {"id":1}
	// exampleUser_update exampleUser 1 {"id":1}
}

// Emit writes a domain event of the application's own in the transaction of the change it belongs to.
func ExampleEmit() {
	db, done := openExampleDB()
	defer done()

	err := db.Transaction(func(tx *gorm.DB) error {
		u := exampleUser{Name: "carl"}
		if err := tx.Create(&u).Error; err != nil {
			return err
		}
		return outboxplugin.Emit(tx, "UserInvited", map[string]any{"id": u.ID, "by": "ann"},
			outboxplugin.WithAggregate("User", fmt.Sprint(u.ID)))
	})
	fmt.Println("committed:", err == nil)

	var e outboxplugin.OutboxEvent
	db.Where("event_type = ?", "UserInvited").First(&e)
	fmt.Println(e.EventType, e.AggregateType, e.AggregateID, string(e.Payload))
	// Output:
	// committed: true
	// UserInvited User 1 {"by":"ann","id":1}
}

// A Worker relays committed events to a Publisher; Run does so until its context ends. ProcessOnce,
// used here to keep the example short, relays one batch.
func ExampleNewWorker() {
	db, done := openExampleDB()
	defer done()
	db.Create(&exampleUser{Name: "ann"})

	pub := outboxplugin.PublisherFunc(func(ctx context.Context, msgs []outboxplugin.Message) error {
		for _, m := range msgs {
			fmt.Println("published", m.EventType, m.Key, string(m.Payload))
		}
		return nil // a broker's publisher returns once the broker has the messages
	})
	worker, err := outboxplugin.NewWorker(db, pub)
	if err != nil {
		fmt.Println(err)
		return
	}
	n, err := worker.ProcessOnce(context.Background())
	fmt.Println(n, err)
	// Output:
	// published exampleUser_create exampleUser:1 {"id":1}
	// 1 <nil>
}
