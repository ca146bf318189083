package outboxplugin_test

import (
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"gorm.io/gorm"
)

// BenchTriggered is BenchUser in a table with an AFTER trigger that changes nothing: what RETURNING
// reports may not be what such a table holds, so PayloadRow reads the rows again after the write.
type BenchTriggered struct {
	ID        uint
	Name      string `gorm:"size:64"`
	Email     string `gorm:"size:128"`
	Age       int
	CreatedAt time.Time
	UpdatedAt time.Time
}

var benchTriggers = map[string][]string{
	"postgres": {
		`CREATE OR REPLACE FUNCTION bench_noop() RETURNS trigger AS $$ BEGIN RETURN NULL; END $$ LANGUAGE plpgsql`,
		`CREATE TRIGGER bench_noop AFTER INSERT OR UPDATE ON bench_triggereds FOR EACH ROW EXECUTE FUNCTION bench_noop()`,
	},
	"sqlite": {`CREATE TRIGGER bench_noop AFTER INSERT ON bench_triggereds BEGIN SELECT 1; END`},
}

func createTriggered(tx *gorm.DB, users []BenchUser) error {
	rows := make([]BenchTriggered, len(users))
	for i, u := range users {
		rows[i] = BenchTriggered{Name: u.Name, Email: u.Email, Age: u.Age}
	}
	if len(rows) == 1 {
		return tx.Create(&rows[0]).Error
	}
	return tx.Create(&rows).Error
}

// BenchmarkRowPayloadAfterTriggers measures the read PayloadRow adds on PostgreSQL and SQLite for a
// table with AFTER triggers: the same creates, with PayloadRow and without the plugin, into a table
// without triggers and into one with a trigger that does nothing. Read row_triggered/plain_triggered
// against row/plain.
//
//	go test -run '^$' -bench BenchmarkRowPayloadAfterTriggers -benchtime 300x
func BenchmarkRowPayloadAfterTriggers(b *testing.B) {
	for _, d := range dialects {
		if benchTriggers[d.server()] == nil {
			continue
		}
		b.Run(d.name, func(b *testing.B) {
			plain, row := openBenchPair(b, d, "", outboxplugin.WithPayloadMode(outboxplugin.PayloadRow))
			resetTables(b, plain, &BenchUser{}, &BenchTriggered{}, &outboxplugin.OutboxEvent{})
			for _, ddl := range benchTriggers[d.server()] {
				if err := plain.Exec(ddl).Error; err != nil {
					b.Fatal(err)
				}
			}
			if err := outboxplugin.AutoMigrate(row); err != nil {
				b.Fatal(err)
			}
			variants := []writeVariant{
				{"plain", plain, createOnly, nil},
				{"row", row, createOnly, nil},
				{"plain_triggered", plain, createTriggered, nil},
				{"row_triggered", row, createTriggered, nil},
			}
			for _, rows := range []int{1, 100} {
				name := "single"
				if rows > 1 {
					name = "batch100"
				}
				b.Run(name, func(b *testing.B) { runInterleaved(b, variants, rows, false) })
			}
		})
	}
}
