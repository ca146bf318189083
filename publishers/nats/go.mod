module github.com/gorm-outbox/outboxplugin/publishers/nats

go 1.26

require github.com/gorm-outbox/outboxplugin v0.0.0-00010101000000-000000000000

replace github.com/gorm-outbox/outboxplugin => ../..
