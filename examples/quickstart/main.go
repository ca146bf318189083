// Command quickstart shows the outbox on an embedded SQLite database, in a temporary directory: it
// creates, updates and deletes a few rows through GORM with the plugin registered, writes one
// explicit event, rolls one transaction back, prints the outbox events the changes left behind, and
// runs the relay worker with a publisher that prints each message it is given.
//
//	go run ./examples/quickstart
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

type User struct {
	ID     uint
	Name   string
	Status string
}

func main() {
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	dir, err := os.MkdirTemp("", "outbox-quickstart-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	db, err := gorm.Open(sqlite.Open(filepath.Join(dir, "app.db")), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		return err
	}
	if err := db.Use(outboxplugin.New()); err != nil {
		return err
	}
	if err := db.AutoMigrate(&User{}); err != nil {
		return err
	}
	if err := outboxplugin.AutoMigrate(db); err != nil { // the outbox table: the relay runs no DDL
		return err
	}

	// Ordinary GORM calls: each changed row gets an event in the same transaction.
	ann, bob := User{Name: "ann", Status: "new"}, User{Name: "bob", Status: "new"}
	if err := db.Create(&[]*User{&ann, &bob}).Error; err != nil {
		return err
	}
	if err := db.Model(&ann).Update("name", "Ann").Error; err != nil {
		return err
	}
	if err := db.Model(&User{}).Where("status = ?", "new").Update("status", "active").Error; err != nil {
		return err
	}
	if err := db.Delete(&bob).Error; err != nil {
		return err
	}

	// An explicit domain event, committed with the row it belongs to.
	err = db.Transaction(func(tx *gorm.DB) error {
		carl := User{Name: "carl", Status: "invited"}
		if err := tx.Create(&carl).Error; err != nil {
			return err
		}
		return outboxplugin.Emit(tx, "UserInvited", map[string]any{"id": carl.ID, "by": "ann"},
			outboxplugin.WithAggregate("User", fmt.Sprint(carl.ID)))
	})
	if err != nil {
		return err
	}

	// A transaction that fails leaves neither its row nor its event.
	err = db.Transaction(func(tx *gorm.DB) error {
		if err := tx.Create(&User{Name: "ghost"}).Error; err != nil {
			return err
		}
		return errors.New("changed my mind")
	})
	var ghosts int64
	if err := db.Model(&User{}).Where("name = ?", "ghost").Count(&ghosts).Error; err != nil {
		return err
	}
	fmt.Printf("rolled back: %v — ghost rows: %d, and no event for ghost below\n\n", err, ghosts)

	var events []outboxplugin.OutboxEvent
	if err := db.Order("id").Find(&events).Error; err != nil {
		return err
	}
	fmt.Printf("%d outbox events:\n", len(events))
	fmt.Printf("%-3s %-14s %-6s %-28s %s\n", "id", "event_type", "key", "payload", "message_id")
	for _, e := range events {
		fmt.Printf("%-3d %-14s %-6s %-28s %s\n", e.ID, e.EventType, e.AggregateType+":"+e.AggregateID, e.Payload, e.MessageID)
	}

	// The relay: a worker claims the committed events, hands them to a publisher in batches and
	// marks them processed. As in an application, Run relays until its context ends (it returns nil
	// then); a real application passes a broker's publisher. Here the publisher prints, and the
	// context ends once the Admin counts nothing left to deliver.
	fmt.Println("\nrelay:")
	printer := outboxplugin.PublisherFunc(func(ctx context.Context, msgs []outboxplugin.Message) error {
		for _, m := range msgs {
			fmt.Printf("published %-14s key=%-7s payload=%s id=%s\n", m.EventType, m.Key, m.Payload, m.ID)
		}
		return nil
	})
	worker, err := outboxplugin.NewWorker(db, printer, outboxplugin.WithBatchSize(5))
	if err != nil {
		return err
	}
	admin, err := outboxplugin.NewAdmin(db)
	if err != nil {
		return err
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- worker.Run(ctx) }()
	var st outboxplugin.Stats
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if st, err = admin.Stats(context.Background()); err != nil || st.Pending == 0 || time.Now().After(deadline) {
			break
		}
	}
	stop()
	if err := errors.Join(err, <-done); err != nil {
		return err
	}
	// Stats counts what the docs recommend watching: events still to be delivered, dead ones, and the
	// oldest pending event's age (docs/operations.md).
	fmt.Printf("still to deliver: %d, dead: %d, processed: %d\n", st.Pending, st.Dead, st.Processed)
	return nil
}
