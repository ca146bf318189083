package sqlerr

import (
	"errors"
	"fmt"
	"testing"
)

// MySQLError has the shape of go-sql-driver's *mysql.MySQLError.
type MySQLError struct {
	Number   uint16
	SQLState [5]byte
	Message  string
}

func (e *MySQLError) Error() string { return fmt.Sprintf("Error %d: %s", e.Number, e.Message) }

// A MySQL error number is found wherever the driver's error sits in the chain, and nothing is found
// in an error that carries none.
func TestMySQLNumber(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		want uint16
		ok   bool
	}{
		{"the driver's error", &MySQLError{Number: 1205}, 1205, true},
		{"wrapped and joined", fmt.Errorf("outboxplugin: update User: %w", errors.Join(errors.New("other"), fmt.Errorf("x: %w", &MySQLError{Number: 1213}))), 1213, true},
		{"a message that merely looks like one", errors.New("Error 1213: not a driver error"), 0, false},
		{"nil", nil, 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			n, ok := MySQLNumber(c.err)
			if n != c.want || ok != c.ok {
				t.Errorf("MySQLNumber = %d, %v; want %d, %v", n, ok, c.want, c.ok)
			}
		})
	}
}

// A chain that wraps itself is walked only so far.
func TestMySQLNumberOfALoopingChain(t *testing.T) {
	var e loop
	e.next = &e
	if _, ok := MySQLNumber(&e); ok {
		t.Error("found a number in a chain without one")
	}
}

type loop struct{ next *loop }

func (l *loop) Error() string { return "loop" }
func (l *loop) Unwrap() error { return l.next }

type pgError struct{ code string }

func (e *pgError) Error() string    { return "ERROR: deadlock detected (SQLSTATE " + e.code + ")" }
func (e *pgError) SQLState() string { return e.code }

func TestSQLState(t *testing.T) {
	if s, ok := SQLState(fmt.Errorf("claim: %w", &pgError{"40P01"})); !ok || s != "40P01" {
		t.Errorf("wrapped: %q, %v", s, ok)
	}
	if _, ok := SQLState(errors.New("ERROR: deadlock detected (SQLSTATE 40P01)")); ok {
		t.Error("a text is not a PostgreSQL error")
	}
	if _, ok := SQLState(nil); ok {
		t.Error("nil")
	}
}
