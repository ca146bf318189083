// Package reliability holds the outbox's reliability suite: process kills, broker outages, database
// faults and poison events, run against the real databases and brokers of the machine. It is a module
// of its own so that the core pulls in none of the broker clients it uses.
// https://github.com/gorm-outbox/outboxplugin/blob/main/docs/reliability.md describes each scenario, how to run it, and the
// figures of the last run.
package reliability
