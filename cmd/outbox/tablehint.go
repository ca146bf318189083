package main

import (
	"errors"
	"strings"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
)

// missingTable reports whether err is the database's "no such table" (or, on PostgreSQL, "no such
// schema" of a --table schema.name): PostgreSQL 42P01 and 3F000, MySQL/MariaDB 1146, SQLite's
// "no such table" (its driver gives no code of its own for it).
func missingTable(err error) bool {
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return pg.Code == "42P01" || pg.Code == "3F000"
	}
	var my *mysql.MySQLError
	if errors.As(err, &my) {
		return my.Number == 1146
	}
	return strings.Contains(err.Error(), "no such table")
}

// missingTableHint is what the command says after an error of a table that does not exist: where the
// table comes from, and the flag that names another.
func (a *app) missingTableHint() string {
	return "The outbox table " + a.table + " does not exist in this database: create it with outbox migrate " +
		"(with the same --db and --table), or give --table if the application's outbox table has another name."
}
