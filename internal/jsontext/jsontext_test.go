package jsontext

import "testing"

func TestValid(t *testing.T) {
	for _, c := range []struct {
		in   string
		want bool
	}{
		{`{"a":1}`, true},
		{` [1, "x"] `, true},
		{`"\u00e9"`, true},
		{"\"\xc3\xa9\"", true},
		{`{"a":`, false},
		{"\"a\xffb\"", false}, // json.Valid alone accepts it
		{``, false},
	} {
		if got := Valid([]byte(c.in)); got != c.want {
			t.Errorf("Valid(%q) = %v, want %v", c.in, got, c.want)
		}
	}
}
