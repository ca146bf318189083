module github.com/gorm-outbox/outboxplugin/publishers/nats

go 1.26.0

require (
	github.com/gorm-outbox/outboxplugin v0.1.0
	github.com/nats-io/nats.go v1.55.0
	github.com/stretchr/testify v1.12.1
	gorm.io/driver/sqlite v1.6.0
	gorm.io/gorm v1.31.2
)

require (
	github.com/jinzhu/inflection v1.0.0 // indirect
	github.com/jinzhu/now v1.1.5 // indirect
	github.com/klauspost/compress v1.20.0 // indirect
	github.com/mattn/go-sqlite3 v1.14.53 // indirect
	github.com/nats-io/nkeys v0.4.16 // indirect
	github.com/nats-io/nuid v1.0.1 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/crypto v0.57.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	golang.org/x/text v0.42.0 // indirect
)
