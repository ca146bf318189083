package inbox

import (
	"context"
	"fmt"
	"strings"

	"gorm.io/gorm"
)

// keyColumnMySQL is the type of the key columns on MySQL and MariaDB: bytes, compared byte for byte
// with no padding — a text column compares by its collation, and the usual ones ignore case and
// accents, and (PAD SPACE, utf8mb4_bin included) trailing spaces. 764 bytes hold MaxKeyLength
// characters of 4 bytes; the two columns take 1528 of the 3072 bytes an InnoDB key may have.
const keyColumnMySQL = "varbinary(764)"

// AutoMigrate creates the inbox table — primary key (consumer, message_id) compared exactly on every
// database, index on handled_at — or brings an existing one up to date, and runs nothing on a table
// that is. The statements are those PlanMigration returns:
//
//   - a new table: on PostgreSQL the key columns have the collation "C" (byte order, the same on every
//     host, so the primary key does not depend on the operating system's locale data); on MySQL and
//     MariaDB they are varbinary; SQLite compares text byte for byte anyway.
//   - a MySQL or MariaDB table whose key columns compare by a collation (as the tables the inbox made
//     before, through GORM's migrator from Record): converted to varbinary, keeping every record.
//     Neither server changes the type of a key column without copying the table, so the conversion
//     copies it (ALGORITHM=COPY), with the least lock the server can: MySQL and MariaDB before 11.2
//     let reads go on, and deliveries wait to write their record until it is done (docs/consuming.md
//     has the time it takes, and how to keep it short); MariaDB 11.2 and later copy online.
//   - a table without the handled_at index: the index, built without holding up writes
//     (CONCURRENTLY on PostgreSQL, in place on MySQL and MariaDB).
//
// PostgreSQL and SQLite tables the inbox made before compare exactly already, and are left as they are.
func (in *Inbox) AutoMigrate(ctx context.Context) error {
	plan, err := in.PlanMigration(ctx)
	if err != nil {
		return err
	}
	for _, stmt := range plan {
		if err := in.db.WithContext(ctx).Exec(stmt).Error; err != nil {
			return fmt.Errorf("inbox: migrate %s: %w", in.table, err)
		}
	}
	return nil
}

// PlanMigration returns the statements AutoMigrate would run now, in order, without running any:
// reading the catalog is all it does. It returns none for an up-to-date table.
func (in *Inbox) PlanMigration(ctx context.Context) ([]string, error) {
	fail := func(err error) ([]string, error) { return nil, fmt.Errorf("inbox: migrate %s: %w", in.table, err) }
	db := in.db.WithContext(ctx)
	m := db.Migrator()
	t, index := in.quotedTable(), in.db.NamingStrategy.IndexName(in.table, "handled_at")
	qindex := (&gorm.Statement{DB: in.db}).Quote(index)
	if !m.HasTable(in.table) {
		switch in.dialect {
		case "postgres":
			return []string{
				`CREATE TABLE IF NOT EXISTS ` + t + ` (consumer varchar(191) COLLATE "C" NOT NULL, message_id varchar(191) COLLATE "C" NOT NULL, ` +
					`handled_at timestamptz(6) NOT NULL, PRIMARY KEY (consumer, message_id))`,
				`CREATE INDEX IF NOT EXISTS ` + qindex + ` ON ` + t + ` (handled_at)`,
			}, nil
		case "mysql":
			return []string{`CREATE TABLE IF NOT EXISTS ` + t + ` (consumer ` + keyColumnMySQL + ` NOT NULL, message_id ` + keyColumnMySQL + ` NOT NULL, ` +
				`handled_at datetime(6) NOT NULL, PRIMARY KEY (consumer, message_id), KEY ` + qindex + ` (handled_at))`}, nil
		default:
			return []string{
				`CREATE TABLE IF NOT EXISTS ` + t + ` (consumer text COLLATE BINARY NOT NULL, message_id text COLLATE BINARY NOT NULL, ` +
					`handled_at datetime NOT NULL, PRIMARY KEY (consumer, message_id))`,
				`CREATE INDEX IF NOT EXISTS ` + qindex + ` ON ` + t + ` (handled_at)`,
			}, nil
		}
	}
	var plan []string
	if in.dialect == "mysql" {
		exact, err := in.mysqlKeyExact(ctx)
		if err != nil {
			return fail(err)
		}
		if !exact {
			// No LOCK clause: the least lock the server can copy under (SHARED before MariaDB 11.2
			// and on MySQL; NONE, an online copy, from MariaDB 11.2).
			plan = append(plan, `ALTER TABLE `+t+` MODIFY consumer `+keyColumnMySQL+` NOT NULL, MODIFY message_id `+keyColumnMySQL+` NOT NULL, ALGORITHM=COPY`)
		}
	}
	if !m.HasIndex(in.table, index) {
		switch in.dialect {
		case "postgres":
			plan = append(plan, `CREATE INDEX CONCURRENTLY IF NOT EXISTS `+qindex+` ON `+t+` (handled_at)`)
		case "mysql":
			plan = append(plan, `ALTER TABLE `+t+` ADD INDEX `+qindex+` (handled_at), ALGORITHM=INPLACE, LOCK=NONE`)
		default:
			plan = append(plan, `CREATE INDEX IF NOT EXISTS `+qindex+` ON `+t+` (handled_at)`)
		}
	}
	return plan, nil
}

// mysqlKeyExact tells whether both key columns of the MySQL/MariaDB table compare byte for byte with
// no padding: varbinary, or text in a NO PAD binary collation (MariaDB's *_nopad_bin, MySQL 8's
// utf8mb4_0900_bin).
func (in *Inbox) mysqlKeyExact(ctx context.Context) (bool, error) {
	schema, name, qualified := strings.Cut(in.table, ".")
	var database any = schema
	if !qualified {
		database, name = nil, in.table
	}
	var cols []struct{ DataType, Collation string }
	if err := in.db.WithContext(ctx).Raw(`SELECT DATA_TYPE AS data_type, COALESCE(COLLATION_NAME, '') AS collation FROM information_schema.COLUMNS
		WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ? AND COLUMN_NAME IN ('consumer', 'message_id')`, database, name).Scan(&cols).Error; err != nil {
		return false, fmt.Errorf("read the key columns: %w", err)
	}
	if len(cols) != 2 {
		return false, fmt.Errorf("the table has %d of the columns consumer and message_id", len(cols))
	}
	for _, c := range cols {
		exact := strings.EqualFold(c.DataType, "varbinary") || strings.HasSuffix(c.Collation, "_nopad_bin") || c.Collation == "utf8mb4_0900_bin"
		if !exact {
			return false, nil
		}
	}
	return true, nil
}
