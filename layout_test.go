package outboxplugin

import (
	"testing"

	"github.com/gorm-outbox/outboxplugin/internal/capture"
)

// The capture (internal/capture) has its own names for values this package exports; they are
// converted as they are, so they must stay equal.
func TestCaptureSharesExportedValues(t *testing.T) {
	for _, c := range []struct {
		public  PayloadMode
		capture capture.PayloadMode
	}{{PayloadKey, capture.PayloadKey}, {PayloadRow, capture.PayloadRow}, {PayloadChanges, capture.PayloadChanges}} {
		if capture.PayloadMode(c.public) != c.capture {
			t.Errorf("PayloadMode %v is %d here and %d in the capture", c.public, c.public, c.capture)
		}
	}
	for _, c := range []struct {
		public  ChangesetType
		capture capture.Op
	}{{ChangesetCreate, capture.OpCreate}, {ChangesetUpdate, capture.OpUpdate}, {ChangesetDelete, capture.OpDelete}} {
		if string(c.public) != string(c.capture) {
			t.Errorf("ChangesetType %q is %q in the capture", c.public, c.capture)
		}
	}
	if p := New(); p.c.Table != DefaultTableName || !p.c.Notify {
		t.Errorf("the capture of New() writes to %q, notify %v", p.c.Table, p.c.Notify)
	}
}
