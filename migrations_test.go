package outboxplugin_test

import (
	"flag"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gorm-outbox/outboxplugin"
)

var updateMigrations = flag.Bool("update-migrations", false, "rewrite the migrations folder with what MigrationFiles renders")

var (
	migrationDialects = []string{"postgres", "mysql", "sqlite"}
	migrationFormats  = []outboxplugin.MigrationFormat{outboxplugin.GolangMigrate, outboxplugin.Goose}
)

// The repository's migrations folder holds what MigrationFiles renders for the default table, file
// for file (go test -run TestMigrationsFolder -update-migrations . rewrites it).
func TestMigrationsFolderIsWhatMigrationFilesRenders(t *testing.T) {
	for _, dialect := range migrationDialects {
		for _, format := range migrationFormats {
			t.Run(dialect+"/"+string(format), func(t *testing.T) {
				fsys, err := outboxplugin.MigrationFiles(format, dialect, "")
				require.NoError(t, err)
				want := readFS(t, fsys, ".")
				dir := filepath.Join("migrations", dialect, string(format))
				if *updateMigrations {
					require.NoError(t, os.RemoveAll(dir))
					require.NoError(t, os.MkdirAll(dir, 0o755))
					for name, body := range want {
						require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644))
					}
				}
				assert.Equal(t, want, readFS(t, os.DirFS(dir), "."), "run go test -run TestMigrationsFolder -update-migrations .")
			})
		}
	}
}

// readFS returns the files of dir in fsys by name.
func readFS(t *testing.T, fsys fs.FS, dir string) map[string]string {
	t.Helper()
	entries, err := fs.ReadDir(fsys, dir)
	require.NoError(t, err)
	out := map[string]string{}
	for _, e := range entries {
		b, err := fs.ReadFile(fsys, e.Name())
		require.NoError(t, err)
		out[e.Name()] = string(b)
	}
	return out
}

// sqlStatements splits a migration file into its statements: comment lines out, split at the
// semicolons that end lines. For goose files, the Up section only.
func sqlStatements(body string) []string {
	if i := strings.Index(body, "-- +goose Down"); i >= 0 {
		body = body[:i]
	}
	var lines []string
	for _, l := range strings.Split(body, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "--") {
			lines = append(lines, l)
		}
	}
	var out []string
	for _, s := range strings.Split(strings.Join(lines, "\n"), ";\n") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// The files are laid out as each tool reads them, and a statement that cannot run in a transaction
// is alone in its golang-migrate file and in a goose file marked NO TRANSACTION; every MySQL file is
// one statement (golang-migrate's MySQL driver then needs no multiStatements). The file system is a
// valid fs.FS.
func TestMigrationFilesShape(t *testing.T) {
	golangMigrateName := regexp.MustCompile(`^[0-9]{6}_[a-z_]+\.(up|down)\.sql$`)
	gooseName := regexp.MustCompile(`^[0-9]{5}_[a-z_]+\.sql$`)
	for _, dialect := range migrationDialects {
		for _, format := range migrationFormats {
			t.Run(dialect+"/"+string(format), func(t *testing.T) {
				fsys, err := outboxplugin.MigrationFiles(format, dialect, "")
				require.NoError(t, err)
				files := readFS(t, fsys, ".")
				names := slices.Sorted(func(yield func(string) bool) {
					for n := range files {
						if !yield(n) {
							return
						}
					}
				})
				require.NoError(t, fstest.TestFS(fsys, names...))
				if format == outboxplugin.GolangMigrate {
					assert.Len(t, files, 18, "an up and a down file for each of 9 versions")
				} else {
					assert.Len(t, files, 9)
				}
				for name, body := range files {
					switch format {
					case outboxplugin.GolangMigrate:
						assert.Regexp(t, golangMigrateName, name)
					case outboxplugin.Goose:
						assert.Regexp(t, gooseName, name)
						assert.Contains(t, body, "\n-- +goose Up\n")
						assert.Contains(t, body, "\n-- +goose Down\n")
					}
					stmts := sqlStatements(body)
					require.NotEmpty(t, stmts, name)
					concurrent := strings.Contains(strings.Join(stmts, "\n"), "CONCURRENTLY")
					if concurrent && format == outboxplugin.GolangMigrate {
						assert.Len(t, stmts, 1, "%s: CONCURRENTLY alone in its file", name)
					}
					if format == outboxplugin.Goose {
						assert.Equal(t, concurrent, strings.HasPrefix(body, "-- +goose NO TRANSACTION\n"), name)
					}
					if dialect == "mysql" {
						assert.Len(t, stmts, 1, "%s: one statement per MySQL file", name)
					}
				}
			})
		}
	}
}

// A custom table name is written into every statement, indexes named as AutoMigrate names them (a
// schema-qualified table's GORM-named indexes after the table alone); a name WithTableName would
// refuse, an unknown database or format are errors.
func TestMigrationFilesTableName(t *testing.T) {
	fsys, err := outboxplugin.MigrationFiles(outboxplugin.Goose, "postgres", "audit.events")
	require.NoError(t, err)
	var all strings.Builder
	for _, body := range readFS(t, fsys, ".") {
		all.WriteString(body)
	}
	assert.NotContains(t, all.String(), "outbox_events")
	for _, want := range []string{`CREATE TABLE "audit"."events"`, `"idx_events_claim" ON "audit"."events"`,
		`"idx_audit_events_dead" ON "audit"."events"`, `DROP INDEX CONCURRENTLY IF EXISTS "audit"."idx_events_pending"`} {
		assert.Contains(t, all.String(), want)
	}

	_, err = outboxplugin.MigrationFiles(outboxplugin.Goose, "postgres", "events; DROP TABLE x")
	assert.ErrorIs(t, err, outboxplugin.ErrInvalidTableName)
	_, err = outboxplugin.MigrationFiles(outboxplugin.Goose, "oracle", "")
	assert.ErrorIs(t, err, outboxplugin.ErrInvalidOption)
	_, err = outboxplugin.MigrationFiles("flyway", "postgres", "")
	assert.ErrorIs(t, err, outboxplugin.ErrInvalidOption)
	_, err = outboxplugin.SchemaSQL("postgres", `"quoted"`)
	assert.ErrorIs(t, err, outboxplugin.ErrInvalidTableName)
	mariadb, err := outboxplugin.SchemaSQL("mariadb", "")
	require.NoError(t, err)
	mysql, err := outboxplugin.SchemaSQL("mysql", "")
	require.NoError(t, err)
	assert.Equal(t, mysql, mariadb)
}

// With WithPartitions the files are one version, the current schema's number, that creates the
// partitioned table with what SchemaSQL with the option returns (the partitions of the interval that
// holds now and the next two) and drops it going down. SQLite, a width of part of an hour and the
// per-key index without partitions are refused.
func TestMigrationFilesPartitioned(t *testing.T) {
	now := time.Date(2026, 12, 7, 15, 0, 0, 0, time.UTC)
	for _, dialect := range []string{"postgres", "mysql"} {
		for _, format := range migrationFormats {
			t.Run(dialect+"/"+string(format), func(t *testing.T) {
				opts := []outboxplugin.MigrateOption{outboxplugin.WithPartitions(12 * time.Hour), outboxplugin.WithMigrateNow(now)}
				fsys, err := outboxplugin.MigrationFiles(format, dialect, "", opts...)
				require.NoError(t, err)
				files := readFS(t, fsys, ".")
				want, err := outboxplugin.SchemaSQL(dialect, "", opts...)
				require.NoError(t, err)
				up, down := "000009_create_partitioned_table.up.sql", "000009_create_partitioned_table.down.sql"
				if format == outboxplugin.Goose {
					require.Len(t, files, 1)
					body := files["00009_create_partitioned_table.sql"]
					require.Contains(t, body, "\n-- +goose Down\n")
					assert.False(t, strings.HasPrefix(body, "-- +goose NO TRANSACTION"), "it runs in a transaction")
					upPart, downPart, _ := strings.Cut(body, "\n-- +goose Down\n")
					files = map[string]string{up: upPart, down: downPart}
				}
				require.Len(t, files, 2)
				assert.Equal(t, want, sqlStatements(files[up]), "the statements of SchemaSQL")
				assert.Contains(t, files[up], "p20261207") // the half day of now
				assert.Contains(t, files[up], "p2026120812")
				if dialect == "mysql" {
					assert.Len(t, sqlStatements(files[up]), 1, "one statement per MySQL file")
				}
				assert.Len(t, sqlStatements(files[down]), 1)
				assert.Contains(t, files[down], "DROP TABLE")

				withIndex, err := outboxplugin.MigrationFiles(format, dialect, "", append(opts, outboxplugin.WithKeyOrderingIndex())...)
				require.NoError(t, err)
				var all strings.Builder
				for _, body := range readFS(t, withIndex, ".") {
					all.WriteString(body)
				}
				assert.Contains(t, all.String(), "idx_outbox_events_key_pending")
			})
		}
	}
	_, err := outboxplugin.MigrationFiles(outboxplugin.Goose, "sqlite", "", outboxplugin.WithPartitions(0))
	assert.ErrorIs(t, err, outboxplugin.ErrInvalidOption)
	_, err = outboxplugin.MigrationFiles(outboxplugin.Goose, "postgres", "", outboxplugin.WithPartitions(90*time.Minute))
	assert.ErrorIs(t, err, outboxplugin.ErrInvalidOption)
	_, err = outboxplugin.MigrationFiles(outboxplugin.Goose, "postgres", "", outboxplugin.WithKeyOrderingIndex())
	assert.ErrorIs(t, err, outboxplugin.ErrInvalidOption)
}
