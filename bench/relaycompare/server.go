package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
)

// The servers the comparison runs on. Each run creates a database of its own on each server, named
// outboxplugin_cmp_<random hex>, does all its work in it and drops it at the end: the server may hold
// other databases (another run, the core tests) and none of them is touched.

// Kinds of server.
const (
	postgresKind = "postgres"
	mysqlKind    = "mysql"
)

// errUnreachable is a server that did not answer.
var errUnreachable = errors.New("server unreachable")

// server is one database server and the database this run created on it.
type server struct {
	kind     string
	adminDSN string
	database string
	// pool is a connection pool on database; every variant uses it through database/sql, GORM or
	// watermill-sql, so they all talk through the same driver.
	pool *sql.DB
}

// serverLabel names a kind of server in the report.
func serverLabel(kind string) string {
	if kind == postgresKind {
		return "PostgreSQL"
	}
	return "MariaDB/MySQL"
}

// newDatabaseName returns a name no other run uses, lower-case so that it needs no quoting.
func newDatabaseName() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "outboxplugin_cmp_" + hex.EncodeToString(b[:])
}

// openServer creates a database of this run on the server at adminDSN and opens a pool on it. A
// server that does not answer within ten seconds is unreachable.
func openServer(ctx context.Context, kind, adminDSN string) (*server, error) {
	s := &server{kind: kind, adminDSN: adminDSN, database: newDatabaseName()}
	admin, err := s.openAdmin()
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := admin.PingContext(pingCtx); err != nil {
		return nil, fmt.Errorf("%s: %w: %w", kind, errUnreachable, err)
	}
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+s.database); err != nil {
		return nil, fmt.Errorf("create database %s: %w", s.database, err)
	}
	s.pool, err = s.openDatabase()
	if err == nil {
		err = s.pool.PingContext(pingCtx)
	}
	if err != nil {
		return nil, errors.Join(fmt.Errorf("open database %s: %w", s.database, err), s.close())
	}
	// Room for two workers (a LISTEN connection each on PostgreSQL) or two forwarders and the
	// connections their shutdown overlaps with; no variant is limited by the pool.
	s.pool.SetMaxOpenConns(16)
	s.pool.SetMaxIdleConns(16)
	return s, nil
}

func (s *server) openAdmin() (*sql.DB, error) {
	if s.kind == postgresKind {
		cfg, err := pgx.ParseConfig(s.adminDSN)
		if err != nil {
			return nil, fmt.Errorf("postgres dsn: %w", err)
		}
		return stdlib.OpenDB(*cfg), nil
	}
	cfg, err := mysql.ParseDSN(s.adminDSN)
	if err != nil {
		return nil, fmt.Errorf("mysql dsn: %w", err)
	}
	return sql.Open("mysql", cfg.FormatDSN())
}

// openDatabase opens a pool on the run's database: the admin DSN with the database name replaced
// (and, on MySQL, parseTime on, which GORM needs to read timestamps).
func (s *server) openDatabase() (*sql.DB, error) {
	if s.kind == postgresKind {
		cfg, err := pgx.ParseConfig(s.adminDSN)
		if err != nil {
			return nil, fmt.Errorf("postgres dsn: %w", err)
		}
		cfg.Database = s.database
		return stdlib.OpenDB(*cfg), nil
	}
	cfg, err := mysql.ParseDSN(s.adminDSN)
	if err != nil {
		return nil, fmt.Errorf("mysql dsn: %w", err)
	}
	cfg.DBName = s.database
	cfg.ParseTime = true
	return sql.Open("mysql", cfg.FormatDSN())
}

// close closes the pool and drops the run's database, within a minute and whatever state the
// caller's context is in (close also runs after Ctrl-C).
func (s *server) close() error {
	if s.pool != nil {
		s.pool.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, err := s.openAdmin()
	if err != nil {
		return err
	}
	defer admin.Close()
	conn, err := admin.Conn(ctx)
	if err != nil {
		return fmt.Errorf("drop database %s: %w", s.database, err)
	}
	defer conn.Close()
	drop := "DROP DATABASE IF EXISTS " + s.database
	if s.kind == postgresKind {
		// FORCE ends sessions left behind by a variant cut short (Ctrl-C mid-drain), which would
		// otherwise make the drop fail.
		drop += " WITH (FORCE)"
	} else if _, err := conn.ExecContext(ctx, "SET SESSION lock_wait_timeout = 45"); err != nil {
		// A transaction left open holds a metadata lock that DROP DATABASE would wait for, by default
		// for a year; the server gives up on its own before the context ends.
		return fmt.Errorf("drop database %s: %w", s.database, err)
	}
	if _, err := conn.ExecContext(ctx, drop); err != nil {
		return fmt.Errorf("drop database %s: %w", s.database, err)
	}
	return nil
}

// quote quotes an identifier for the server.
func (s *server) quote(name string) string {
	if s.kind == postgresKind {
		return `"` + name + `"`
	}
	return "`" + name + "`"
}

// afterFill prepares PostgreSQL the way the core module's relay benchmark does once a backlog is in:
// statistics for the planner, and a checkpoint so that no variant pays for writing out the pages the
// fill left dirty. MariaDB needs neither.
func (s *server) afterFill(ctx context.Context, table string) error {
	if s.kind != postgresKind {
		return nil
	}
	if _, err := s.pool.ExecContext(ctx, "ANALYZE "+s.quote(table)); err != nil {
		return fmt.Errorf("analyze %s: %w", table, err)
	}
	if _, err := s.pool.ExecContext(ctx, "CHECKPOINT"); err != nil {
		return fmt.Errorf("checkpoint (needs superuser or pg_checkpoint): %w", err)
	}
	return nil
}

// dropTables drops the given tables if they exist.
func (s *server) dropTables(ctx context.Context, tables ...string) error {
	for _, t := range tables {
		if _, err := s.pool.ExecContext(ctx, "DROP TABLE IF EXISTS "+s.quote(t)); err != nil {
			return fmt.Errorf("drop table %s: %w", t, err)
		}
	}
	return nil
}
