package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gorm-outbox/outboxplugin/inbox"
)

// A consumer handles a message delivered twice: the second delivery finds its record and changes
// nothing.
func ExampleInbox_Handle() {
	dir, _ := os.MkdirTemp("", "inbox-example")
	defer os.RemoveAll(dir)
	db, _ := gorm.Open(sqlite.Open(filepath.Join(dir, "consumer.db")), &gorm.Config{Logger: logger.Discard})
	_ = db.AutoMigrate(&Invoice{})
	in, _ := inbox.New(db)
	_ = in.AutoMigrate(context.Background())

	// msgID comes from the broker's message: outboxnats.MessageID(msg), outboxrabbitmq.MessageID(d), ...
	msgID := "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"
	for delivery := 1; delivery <= 2; delivery++ {
		ran, err := in.Handle(context.Background(), "billing", msgID, func(tx *gorm.DB) error {
			return tx.Create(&Invoice{MessageID: msgID}).Error
		})
		switch {
		case errors.Is(err, inbox.ErrInProgress):
			fmt.Println("being handled by another delivery: do not acknowledge")
		case err != nil:
			fmt.Println("failed, rolled back: let the broker redeliver:", err)
		default:
			fmt.Printf("delivery %d: ran=%v, acknowledge\n", delivery, ran)
		}
	}
	var n int64
	db.Model(&Invoice{}).Count(&n)
	fmt.Println("invoices:", n)
	// Output:
	// delivery 1: ran=true, acknowledge
	// delivery 2: ran=false, acknowledge
	// invoices: 1
}
