package outboxplugin_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gorm-outbox/outboxplugin"
)

// NewWorker refuses a database engine whose claim would not skip locked rows, saying which and why;
// the servers here (a stand-in answers for those that are not) are taken.
func TestNewWorkerRefusesEnginesWithoutSkipLocked(t *testing.T) {
	for _, d := range relayDialects() {
		t.Run(d.name, func(t *testing.T) {
			db := setup(t, d, nil)
			w, err := outboxplugin.NewWorker(db, noopPublisher, outboxplugin.WithLogger(quietLogger))
			require.NoError(t, err, "the server on this machine")
			_, err = w.ProcessOnce(context.Background())
			require.NoError(t, err)

			var refused, taken []string
			switch d.server() {
			case "mysql":
				refused = []string{"8.0.11-TiDB-v7.5.1", "5.7.44-log", "8.0.0-dmr", "5.5.5-10.5.23-MariaDB", "10.3.39-MariaDB"}
				taken = []string{"8.0.36", "10.6.0-MariaDB", "11.4.2-MariaDB"}
			case "postgres":
				refused = []string{"PostgreSQL 9.4.26 on x86_64-pc-linux-gnu"}
				taken = []string{"PostgreSQL 9.5.0 on x86_64-pc-linux-gnu", "PostgreSQL 17.2 on aarch64"}
			default:
				taken = []string{"3.46.0"}
			}
			for _, v := range refused {
				_, err := outboxplugin.NewWorker(db, noopPublisher, outboxplugin.WithServerVersion(v))
				require.ErrorIs(t, err, outboxplugin.ErrUnsupportedEngine, v)
				assert.Contains(t, err.Error(), v, "the error names the server's version")
				assert.Contains(t, err.Error(), "SKIP LOCKED")
			}
			for _, v := range taken {
				_, err := outboxplugin.NewWorker(db, noopPublisher, outboxplugin.WithServerVersion(v))
				assert.NoError(t, err, v)
			}
		})
	}
}

// A relay may start before its database: NewWorker does not fail when the server cannot be asked its
// version, and the first claim asks again.
func TestNewWorkerBeforeItsDatabase(t *testing.T) {
	for _, d := range relayDialects() {
		if d.server() == "sqlite" {
			continue
		}
		t.Run(d.name, func(t *testing.T) {
			setup(t, d, nil)
			proxy := proxyTo(t, d)
			db := openThrough(t, d, proxy)
			proxy.Cut()
			w, err := outboxplugin.NewWorker(db, noopPublisher, outboxplugin.WithLogger(quietLogger))
			require.NoError(t, err, "the database is away: asked again at the first claim")
			_, err = w.ProcessOnce(context.Background())
			require.Error(t, err, "the database is away")
			proxy.Restore()
			_, err = w.ProcessOnce(context.Background())
			require.NoError(t, err, "the version asked at the first claim")
		})
	}
}
