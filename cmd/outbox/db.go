package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"net/url"
	"os"
	"regexp"
	"strings"

	"github.com/go-sql-driver/mysql"
	gormmysql "gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gorm-outbox/outboxplugin"
)

// Which database a DSN is for.
const (
	kindPostgres = "postgres"
	kindMySQL    = "mysql"
	kindSQLite   = "sqlite"
)

var (
	// A key=value DSN of PostgreSQL names its host or its database.
	pgKeyValueRE = regexp.MustCompile(`(^|\s)(host|dbname)\s*=`)
	// A go-sql-driver DSN: [user[:password]@][net[(addr)]]/dbname[?params].
	mysqlDSNRE = regexp.MustCompile(`@([a-z0-9]*\([^)]*\))?/`)
)

// parseDSN tells which database dsn is for (the rules of the root command's help, in order) and
// returns the DSN its driver takes. Its errors never quote dsn: it may hold a password.
func parseDSN(dsn string) (kind, driverDSN string, err error) {
	lower := strings.ToLower(dsn)
	pathPart, _, _ := strings.Cut(lower, "?")
	switch {
	case strings.HasPrefix(lower, "postgres://"), strings.HasPrefix(lower, "postgresql://"):
		return kindPostgres, dsn, nil
	case strings.HasPrefix(lower, "mysql://"):
		d, err := mysqlURLToDSN(dsn)
		return kindMySQL, d, err
	case strings.HasPrefix(lower, "sqlite://"):
		return kindSQLite, dsn[len("sqlite://"):], nil
	case strings.HasPrefix(lower, "file:"),
		strings.HasSuffix(pathPart, ".db"), strings.HasSuffix(pathPart, ".sqlite"), strings.HasSuffix(pathPart, ".sqlite3"):
		return kindSQLite, dsn, nil
	case pgKeyValueRE.MatchString(dsn):
		return kindPostgres, dsn, nil
	case mysqlDSNRE.MatchString(dsn):
		cfg, err := mysql.ParseDSN(dsn)
		if err != nil {
			return "", "", usagef("--db: not a valid MySQL DSN: %v", err)
		}
		cfg.ParseTime = true // the Admin reads DATETIME columns as time.Time
		return kindMySQL, cfg.FormatDSN(), nil
	}
	return "", "", usagef("--db: cannot tell the database: want a postgres:// URL or key=value DSN with host= or dbname=, " +
		"a MySQL DSN user:pass@tcp(host:port)/db or mysql:// URL, or a SQLite path (*.db, *.sqlite, file:..., sqlite://...)")
}

// mysqlURLToDSN converts mysql://user:pass@host:port/db?params to go-sql-driver's form.
func mysqlURLToDSN(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", usagef("--db: not a valid mysql:// URL") // url's error quotes the URL
	}
	host := u.Host
	if host == "" {
		host = "127.0.0.1"
	}
	if u.Port() == "" {
		host = net.JoinHostPort(strings.Trim(host, "[]"), "3306")
	}
	cfg, err := mysql.ParseDSN("tcp(" + host + ")/" + strings.TrimPrefix(u.Path, "/") + "?" + u.RawQuery)
	if err != nil {
		return "", usagef("--db: mysql:// URL: %v", err)
	}
	if u.User != nil {
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
	}
	cfg.ParseTime = true
	return cfg.FormatDSN(), nil
}

// readDSN returns the DSN of --db or --db-file, and remembers it for redact.
func (a *app) readDSN() (string, error) {
	switch {
	case a.db != "" && a.dbFile != "":
		return "", usagef("--db and --db-file are exclusive: give one")
	case a.dbFile != "":
		b, err := os.ReadFile(a.dbFile)
		if err != nil {
			return "", usagef("--db-file: %w", err)
		}
		a.dsn = strings.TrimSpace(string(b))
		if a.dsn == "" {
			return "", usagef("--db-file %s is empty", a.dbFile)
		}
	case a.db != "":
		a.dsn = strings.TrimSpace(a.db)
	default:
		return "", usagef("no database: give --db or --db-file (or OUTBOX_DB, OUTBOX_DB_FILE)")
	}
	return a.dsn, nil
}

// openDB opens the database of --db or --db-file, with GORM's logging off (its messages quote SQL
// and driver errors), and checks it is reachable. A SQLite file that does not exist is an error: see
// sqliteMustExist.
func (a *app) openDB(ctx context.Context) (*gorm.DB, error) { return a.open(ctx, false) }

// open is openDB, and with create a SQLite file that does not exist is created (migrate).
func (a *app) open(ctx context.Context, create bool) (*gorm.DB, error) {
	dsn, err := a.readDSN()
	if err != nil {
		return nil, err
	}
	kind, driverDSN, err := parseDSN(dsn)
	if err != nil {
		return nil, err
	}
	// --table's name is a usage error before the database is looked at, as the other flags'.
	if _, err := outboxplugin.SchemaSQL(kindSQLite, a.table); errors.Is(err, outboxplugin.ErrInvalidTableName) {
		return nil, usageError{fmt.Errorf("--table: %w", err)}
	}
	if !create {
		if err := sqliteMustExist(kind, driverDSN); err != nil {
			return nil, err
		}
	}
	if kind == kindMySQL {
		// The driver logs some connection errors itself, to stderr.
		_ = mysql.SetLogger(log.New(redactingWriter{a}, "[mysql] ", log.LstdFlags))
	}
	db, err := gorm.Open(dialector(kind, driverDSN), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		return nil, fmt.Errorf("open the %s database: %w", kind, err)
	}
	return db.WithContext(ctx), nil
}

// dialector returns GORM's dialector of kind for dsn.
func dialector(kind, dsn string) gorm.Dialector {
	switch kind {
	case kindPostgres:
		return postgres.New(postgres.Config{DSN: dsn})
	case kindMySQL:
		return gormmysql.New(gormmysql.Config{DSN: dsn})
	}
	return &sqlite.Dialector{DSN: dsn}
}

// closeDB closes db's connections.
func closeDB(db *gorm.DB) {
	if sqlDB, err := db.DB(); err == nil {
		_ = sqlDB.Close()
	}
}

// admin opens the database and returns an Admin of --table, and a function that closes the database.
func (a *app) admin(ctx context.Context) (*outboxplugin.Admin, func(), error) {
	db, err := a.openDB(ctx)
	if err != nil {
		return nil, nil, err
	}
	adm, err := outboxplugin.NewAdmin(db, outboxplugin.WithAdminTable(a.table))
	if err != nil {
		closeDB(db)
		return nil, nil, usageError{err}
	}
	return adm, func() { closeDB(db) }, nil
}

// redactingWriter writes to the app's stderr with credentials redacted.
type redactingWriter struct{ a *app }

func (w redactingWriter) Write(p []byte) (int, error) {
	if _, err := w.a.stderr.WriteString(w.a.redact(string(p))); err != nil {
		return 0, err
	}
	return len(p), nil
}
