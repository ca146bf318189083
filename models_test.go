package outboxplugin_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"gorm.io/gorm"
)

// Models of the capture tests.

type User struct {
	ID        uint
	Name      string
	Age       int
	Status    string
	Pets      []Pet
	Languages []Language `gorm:"many2many:user_languages"`
	CreatedAt time.Time
	UpdatedAt time.Time
}

var errHook = errors.New("hook refused")

// Hooks fail on purpose for names that ask for it, to test that the row and its event roll back
// together.
func (u *User) AfterCreate(*gorm.DB) error {
	if u.Name == "fail-after-create" {
		return errHook
	}
	return nil
}

func (u *User) AfterUpdate(*gorm.DB) error {
	if u.Name == "fail-after-update" {
		return errHook
	}
	return nil
}

func (u *User) AfterDelete(*gorm.DB) error {
	if u.Name == "fail-after-delete" {
		return errHook
	}
	return nil
}

type Pet struct {
	ID     uint
	UserID uint
	Name   string
}

type Language struct {
	Code string `gorm:"primaryKey;size:8"`
	Name string
}

type SoftUser struct {
	ID        uint
	Name      string
	DeletedAt gorm.DeletedAt `gorm:"index"`
}

type OrderLine struct {
	OrderID uint `gorm:"primaryKey;autoIncrement:false"`
	LineNo  int  `gorm:"primaryKey;autoIncrement:false"`
	Qty     int
}

// Tally has no primary key.
type Tally struct {
	Name  string `gorm:"size:32"`
	Count int
}

var captureModels = []any{&outboxplugin.OutboxEvent{}, &User{}, &Pet{}, &Language{}, &SoftUser{}, &OrderLine{}, &Tally{}, "user_languages"}

// loadEvents returns the outbox rows in insertion order.
func loadEvents(t testing.TB, db *gorm.DB) []outboxplugin.OutboxEvent {
	t.Helper()
	var evs []outboxplugin.OutboxEvent
	if err := db.Session(&gorm.Session{NewDB: true}).Order("id").Find(&evs).Error; err != nil {
		t.Fatalf("load events: %v", err)
	}
	return evs
}

// eventKeys returns "Type id" for each event whose payload is {"id": n}, sorted.
func eventKeys(t testing.TB, evs []outboxplugin.OutboxEvent) []string {
	t.Helper()
	out := make([]string, len(evs))
	for i, e := range evs {
		var p struct {
			ID *json.Number `json:"id"`
		}
		dec := json.NewDecoder(bytes.NewReader(e.Payload))
		dec.UseNumber()
		if err := dec.Decode(&p); err != nil {
			t.Fatalf("payload %s: %v", e.Payload, err)
		}
		id := "?"
		if p.ID != nil {
			id = p.ID.String()
		}
		out[i] = e.EventType + " " + id
	}
	sort.Strings(out)
	return out
}

func payloadMap(t testing.TB, e outboxplugin.OutboxEvent) map[string]any {
	t.Helper()
	var m map[string]any
	dec := json.NewDecoder(bytes.NewReader(e.Payload))
	dec.UseNumber()
	if err := dec.Decode(&m); err != nil {
		t.Fatalf("payload %s: %v", e.Payload, err)
	}
	return m
}

func count(t testing.TB, db *gorm.DB, model any) int64 {
	t.Helper()
	var n int64
	if err := db.Session(&gorm.Session{NewDB: true}).Model(model).Count(&n).Error; err != nil {
		t.Fatalf("count: %v", err)
	}
	return n
}

// normalizeJSON re-encodes the JSON after the first space of each "Type {json}" line, compactly and
// with sorted keys: PostgreSQL's jsonb and MySQL's json hand documents back in their own spacing.
func normalizeJSON(t testing.TB, lines []string) []string {
	t.Helper()
	out := make([]string, len(lines))
	for i, l := range lines {
		typ, doc, _ := strings.Cut(l, " ")
		var v any
		dec := json.NewDecoder(strings.NewReader(doc))
		dec.UseNumber()
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("%q: %v", l, err)
		}
		enc, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = typ + " " + string(enc)
	}
	return out
}
