package sqlname

import "testing"

func TestValid(t *testing.T) {
	long := "a23456789012345678901234567890123456789012345678901234567890123" // 63 characters
	for name, want := range map[string]bool{
		"outbox_events":          true,
		"audit.events":           true,
		"_x.Y9":                  true,
		long:                     true,
		long + "4":               false, // 64
		long + "." + long:        true,
		"":                       false,
		"9events":                false,
		"a.b.c":                  false,
		"events;drop table x":    false,
		`"events"`:               false,
		"my events":              false,
		"audit.":                 false,
		".events":                false,
		"événements":             false,
		"events\n":               false,
		"outbox_events--comment": false,
	} {
		if got := Valid(name); got != want {
			t.Errorf("Valid(%q) = %v, want %v", name, got, want)
		}
	}
}

func TestPG(t *testing.T) {
	for name, want := range map[string]string{
		"outbox_events": `"outbox_events"`,
		"audit.Events":  `"audit"."Events"`,
		`we"ird`:        `"we""ird"`, // never a valid name; quoted safely all the same
	} {
		if got := PG(name); got != want {
			t.Errorf("PG(%q) = %s, want %s", name, got, want)
		}
	}
	if got := PGIdent("audit.events"); got != `"audit.events"` {
		t.Errorf("PGIdent quotes the whole name as one identifier: %s", got)
	}
}
