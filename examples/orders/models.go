package main

import "time"

// Order is the service's own table. Its creates and updates are captured by the plugin as
// Order_create and Order_update events; placing and cancelling also emit the domain events
// OrderPlaced and OrderCancelled in the same transaction.
type Order struct {
	ID        uint      `json:"id"`
	Customer  string    `gorm:"not null" json:"customer"`
	Amount    int64     `gorm:"not null" json:"amount"` // in the smallest unit of the currency (cents)
	Status    string    `gorm:"not null" json:"status"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// Statuses of an Order.
const (
	statusPlaced    = "placed"
	statusCancelled = "cancelled"
)

// OrderNotification is the consumer's effect: one row per domain event it acted on. A message
// delivered twice must not give two rows.
type OrderNotification struct {
	ID        uint
	OrderID   uint   `gorm:"not null;index"`
	Kind      string `gorm:"not null"` // "placed" or "cancelled"
	Text      string `gorm:"not null"`
	CreatedAt time.Time
}

// ProcessedMessage records a message the consumer has acted on, by its message id (the outbox
// event's id, which the NATS publisher sends as Nats-Msg-Id). It is inserted in the same
// transaction as the effect, so the two commit together: a redelivered message finds its row and
// is acknowledged without acting again.
type ProcessedMessage struct {
	MessageID   string `gorm:"primaryKey"`
	Subject     string `gorm:"not null"`
	ProcessedAt time.Time
}
