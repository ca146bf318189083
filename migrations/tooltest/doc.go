// Package tooltest applies the outbox table's migration files (outboxplugin.MigrationFiles, the
// repository's migrations folder) with the real tools, golang-migrate and goose, used as libraries,
// to fresh databases on PostgreSQL, MariaDB and SQLite, and checks that the table they make is the
// one outboxplugin.AutoMigrate makes, that AutoMigrate then has nothing to run, and that a worker
// relays from it. It is a module of its own so that the core pulls in neither tool; it holds tests
// and no API.
package tooltest
