// Package sqlerr reads what the database drivers say in their errors without importing them: the core
// module depends on gorm.io/gorm alone, so go-sql-driver's *mysql.MySQLError is read by its shape. The
// capture (a savepoint's rollback after a deadlock) and the relay (a claim that was a deadlock victim)
// both ask it.
package sqlerr

import "reflect"

// MySQLNumber returns the server's error number of a MySQL or MariaDB error in err's chain
// (go-sql-driver's *mysql.MySQLError: a struct named MySQLError with a uint16 Number).
func MySQLNumber(err error) (uint16, bool) {
	for _, e := range chain(err) {
		v := reflect.ValueOf(e)
		if v.Kind() == reflect.Pointer {
			v = v.Elem()
		}
		if v.Kind() != reflect.Struct || v.Type().Name() != "MySQLError" {
			continue
		}
		if f := v.FieldByName("Number"); f.IsValid() && f.Kind() == reflect.Uint16 {
			return uint16(f.Uint()), true
		}
	}
	return 0, false
}

// chain lists err and every error it wraps, depth first, up to 65 of them.
func chain(err error) []error {
	var out []error
	var walk func(error)
	walk = func(e error) {
		if e == nil || len(out) > 64 {
			return
		}
		out = append(out, e)
		switch u := e.(type) {
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		case interface{ Unwrap() []error }:
			for _, x := range u.Unwrap() {
				walk(x)
			}
		}
	}
	walk(err)
	return out
}

// SQLState returns the SQLSTATE of a PostgreSQL error in err's chain: any error with a SQLState()
// string method, as pgx's *pgconn.PgError and lib/pq's *pq.Error have.
func SQLState(err error) (string, bool) {
	for _, e := range chain(err) {
		if s, ok := e.(interface{ SQLState() string }); ok {
			return s.SQLState(), true
		}
	}
	return "", false
}
