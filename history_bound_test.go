package outboxplugin

import (
	"errors"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin/internal/relay/failure"
)

// The bound AttemptHistory documents is the one the relay's failure entries keep.
func TestMaxAttemptErrorBytesIsTheEntriesBound(t *testing.T) {
	if MaxAttemptErrorBytes != failure.MaxErrorBytes {
		t.Errorf("MaxAttemptErrorBytes %d, the entries keep %d", MaxAttemptErrorBytes, failure.MaxErrorBytes)
	}
}

// The entry a failure statement appends decodes to the Attempt it recorded.
func TestAttemptRecordRoundTrips(t *testing.T) {
	at := time.Date(2025, 1, 2, 3, 4, 5, 123456789, time.UTC)
	rec := failure.Attempt(at, 3, errors.New(`refused: <"x"> & more`), 12345*time.Microsecond)
	h := AttemptHistory("[" + rec.Entry("relay-1") + "]")
	got, err := h.Attempts()
	if err != nil {
		t.Fatal(err)
	}
	want := []Attempt{{At: at, Number: 3, Worker: "relay-1", Error: `refused: <"x"> & more`, Duration: 12345 * time.Microsecond}}
	if len(got) != 1 || got[0] != want[0] {
		t.Errorf("got %+v, want %+v", got, want)
	}
	if none, err := AttemptHistory(nil).Attempts(); none != nil || err != nil {
		t.Errorf("nil history: %v, %v", none, err)
	}
	if _, err := AttemptHistory(`{"not":"an array"}`).Attempts(); err == nil {
		t.Error("a document that is not an array decodes")
	}
}
