package inbox

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"database/sql/driver"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"gorm.io/gorm"
)

// cleanupTimeout bounds what a delivery does after its handler to leave no lock behind (release the
// named lock, end a session that keeps it), under a context of its own: the delivery's may have ended.
const cleanupTimeout = 5 * time.Second

// keyLocks is the set of keys an Inbox is handling.
type keyLocks struct {
	mu   sync.Mutex
	held map[string]struct{}
}

func (l *keyLocks) tryLock(key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.held[key]; ok {
		return false
	}
	l.held[key] = struct{}{}
	return true
}

func (l *keyLocks) unlock(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.held, key)
}

// lockScope names the inbox table on its server, for the locks of its messages: MySQL's named locks
// are server-wide, so two databases (two applications, two test runs) with a table of the same name
// must not share them; PostgreSQL's advisory locks are per database already, but two schemas of one
// database may each have a table of that name. A table named with its database or schema and without
// it (through the search_path or the connection's database) is one table and gets one scope. It is
// read from the database once per Inbox.
func (in *Inbox) lockScope(db *gorm.DB) (string, error) {
	in.scopeMu.Lock()
	defer in.scopeMu.Unlock()
	if in.scope != "" {
		return in.scope, nil
	}
	qualifier, name, qualified := strings.Cut(in.table, ".")
	if !qualified {
		qualifier, name = "", in.table
	}
	switch in.dialect {
	case "mysql":
		if !qualified {
			var current *string
			if err := db.Raw(`SELECT DATABASE()`).Scan(&current).Error; err != nil {
				return "", fmt.Errorf("read the current database: %w", err)
			}
			if current == nil {
				return "", errors.New("no database selected: name the inbox table with its database (WithTable)")
			}
			qualifier = *current
		}
	case "postgres":
		if !qualified {
			// The schema the search_path finds the table in, or would create it in.
			if err := db.Raw(`SELECT coalesce((SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
				WHERE c.oid = to_regclass(?)), current_schema())`, in.quotedTable()).Scan(&qualifier).Error; err != nil {
				return "", fmt.Errorf("read the table's schema: %w", err)
			}
		}
	default: // SQLite: the lock of the process only, which is the Inbox's own
	}
	in.scope = qualifier + "\x00" + name
	return in.scope, nil
}

// lockDigest is the hash of the exact bytes of scope, consumer and message id (none holds a NUL:
// checkKey refuses them) that names the message's lock on the database: as exact as the record's key,
// so that ids the table tells apart never share a lock.
func lockDigest(scope, consumer, messageID string) [sha256.Size]byte {
	return sha256.Sum256([]byte("outboxplugin inbox\x00" + scope + "\x00" + consumer + "\x00" + messageID))
}

// advisoryLockKey is the PostgreSQL advisory lock key of a digest.
func advisoryLockKey(d [sha256.Size]byte) int64 {
	return int64(binary.BigEndian.Uint64(d[:8]))
}

// namedLock is the MySQL/MariaDB lock name of a digest: 160 bits of it, within the 64 characters a
// name may have.
func namedLock(d [sha256.Size]byte) string {
	return "outboxplugin_inbox_" + hex.EncodeToString(d[:20])
}

// withNamedLock runs fn on one connection of db while that session holds the named lock, or returns
// ErrInProgress without waiting when another session holds it: GET_LOCK with a timeout of 0, released
// after fn's transaction has ended, so that a delivery that gets the lock sees the record of any
// delivery before it that committed.
//
// The lock belongs to the session, not to a transaction: a connection back in the pool still holding
// it would refuse every delivery of the message for as long as the connection lives. So it is released
// whatever fn did and whatever became of ctx (see releaseNamedLock), and a connection whose release is
// not confirmed is never put back in the pool.
func (in *Inbox) withNamedLock(ctx context.Context, db *gorm.DB, name string, fn func(conn *gorm.DB) error) error {
	return db.Connection(func(conn *gorm.DB) error {
		var lock struct {
			Got *int64 `gorm:"column:got"`
			ID  int64  `gorm:"column:id"`
		}
		err := conn.Raw(`SELECT GET_LOCK(?, 0) AS got, CONNECTION_ID() AS id`, name).Scan(&lock).Error
		if err == nil && (lock.Got == nil || *lock.Got != 1) {
			return ErrInProgress
		}
		// Held — or perhaps held: a statement that failed may have been answered on the server.
		defer in.releaseNamedLock(ctx, conn, name, lock.ID)
		if err != nil {
			return err
		}
		return fn(conn)
	})
}

// releaseNamedLock releases the named lock on conn under a context of its own, detached from ctx and
// bounded by cleanupTimeout: when the delivery's context ended inside the handler (a deadline), a
// statement under it would not even be sent. If the release is not confirmed, conn is discarded
// rather than put back in the pool; and as the server keeps a closed connection's session (and its
// lock) until the statement it is running ends — a handler's statement waiting for a row lock, up to
// innodb_lock_wait_timeout — that session is ended too, if it is still the lock's holder (id: its
// CONNECTION_ID(), 0 when unknown).
func (in *Inbox) releaseNamedLock(ctx context.Context, conn *gorm.DB, name string, id int64) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if conn.WithContext(rctx).Exec(`DO RELEASE_LOCK(?)`, name).Error == nil {
		return // the session answered: it holds the lock no more
	}
	if c, ok := conn.Statement.ConnPool.(*sql.Conn); ok {
		// A callback's driver.ErrBadConn makes database/sql close the connection instead of pooling it.
		_ = c.Raw(func(any) error { return driver.ErrBadConn })
	}
	if id == 0 {
		return
	}
	// Connection ids are unique while the server runs, and the lock's holder is checked first: a
	// session of that id holding this message's lock is the one the delivery left (or, after a server
	// restart reused the id, another delivery of the same message, which then fails and is redelivered).
	var holder *int64
	if err := in.db.WithContext(rctx).Raw(`SELECT IS_USED_LOCK(?)`, name).Scan(&holder).Error; err != nil || holder == nil || *holder != id {
		return
	}
	// Ending one's own sessions needs no privilege; if it fails, the lock goes when the statement ends.
	if in.db.WithContext(rctx).Exec(fmt.Sprintf("KILL %d", id)).Error != nil {
		return
	}
	// The session ends soon after: return once it has, so that the next delivery finds the lock free.
	awaitRelease(rctx, func(ctx context.Context) (bool, error) {
		var holder *int64
		err := in.db.WithContext(ctx).Raw(`SELECT IS_USED_LOCK(?)`, name).Scan(&holder).Error
		return holder != nil && *holder == id, err
	})
}

// awaitAdvisoryRelease returns once the PostgreSQL session pid holds the transaction-level advisory
// lock key no more, or after cleanupTimeout. When the delivery's context ended, its transaction ends
// on the server a moment after Handle's: database/sql rolls it back in a goroutine of its own, and a
// statement cut off is cancelled by a request the driver sends from another. Waiting for it makes the
// next delivery find the lock free.
func (in *Inbox) awaitAdvisoryRelease(ctx context.Context, key, pid int64) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	// A bigint key shows in pg_locks as its high and low 32 bits, with objsubid 1.
	hi, lo := int64(uint64(key)>>32), int64(uint64(key)&0xffffffff)
	awaitRelease(rctx, func(ctx context.Context) (bool, error) {
		var held bool
		err := in.db.WithContext(ctx).Raw(`SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND pid = ?
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
			AND classid::bigint = ? AND objid::bigint = ? AND objsubid = 1)`, pid, hi, lo).Scan(&held).Error
		return held, err
	})
}

// awaitRelease calls held until it answers false or fails, or ctx ends.
func awaitRelease(ctx context.Context, held func(context.Context) (bool, error)) {
	for {
		if h, err := held(ctx); err != nil || !h {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
}
