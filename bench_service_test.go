package outboxplugin_test

import (
	"fmt"

	"gorm.io/gorm"
)

// serviceTransaction is the transaction a service runs for one request: 4 creates, 3 updates by key,
// 1 update by condition of 2 rows and 2 deletes, 11 changed rows in 10 statements.
func serviceTransaction(tx *gorm.DB, tag string) error {
	users := make([]BenchUser, 4)
	for i := range users {
		users[i] = BenchUser{Name: tag, Email: fmt.Sprintf("%s-%d@example.com", tag, i), Age: i}
		if err := tx.Create(&users[i]).Error; err != nil {
			return err
		}
	}
	for i := range 3 {
		if err := tx.Model(&users[i]).Update("age", 40+i).Error; err != nil {
			return err
		}
	}
	if err := tx.Model(&BenchUser{}).Where("id IN ? AND age >= ?", []uint{users[0].ID, users[1].ID}, 40).
		Update("email", tag+"@changed.example.com").Error; err != nil {
		return err
	}
	for i := 2; i < 4; i++ {
		if err := tx.Delete(&users[i]).Error; err != nil {
			return err
		}
	}
	return nil
}

// serviceEvents are the event types serviceTransaction gives, in statement order.
var serviceEvents = []string{
	"BenchUser_create", "BenchUser_create", "BenchUser_create", "BenchUser_create",
	"BenchUser_update", "BenchUser_update", "BenchUser_update",
	"BenchUser_update", "BenchUser_update",
	"BenchUser_delete", "BenchUser_delete",
}
