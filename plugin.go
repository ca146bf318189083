package outboxplugin

import (
	"context"
	"fmt"
	"reflect"

	"gorm.io/gorm"
	"gorm.io/gorm/schema"

	"github.com/gorm-outbox/outboxplugin/internal/capture"
	"github.com/gorm-outbox/outboxplugin/internal/sqlname"
)

const pluginName = "outboxplugin"

var _ gorm.Plugin = (*Plugin)(nil)

// Plugin captures the changes GORM writes as outbox events. Register it with db.Use(New(...)).
type Plugin struct {
	cfg config
	err error // the first invalid option, returned by Initialize

	c          *capture.Capturer // the capture: statements to events, held until commit (internal/capture)
	notifyInTx bool              // no NOTIFY after commit: pg_notify inside every transaction, as before; set by benchmarks
	sqlTx      bool              // transactions on *sql.Tx, the INSERT before the COMMIT, on every driver; set by benchmarks
}

// New returns the plugin. Invalid options are reported by db.Use, which returns the error of
// Initialize.
func New(opts ...Option) *Plugin {
	p := &Plugin{cfg: defaultConfig()}
	for _, opt := range opts {
		if opt == nil {
			continue
		}
		if err := opt(&p.cfg); err != nil && p.err == nil {
			p.err = fmt.Errorf("outboxplugin: %w", err)
		}
	}
	p.c = capture.New(p.cfg.capture())
	return p
}

// Name returns "outboxplugin", the name GORM registers the plugin under.
func (p *Plugin) Name() string { return pluginName }

// Initialize registers the capture callbacks. It fails, registering nothing, when an option was
// invalid.
func (p *Plugin) Initialize(db *gorm.DB) error {
	if p.err != nil {
		return p.err
	}
	notify := p.cfg.notify && !p.notifyInTx && db.Dialector.Name() == "postgres"
	cw, err := capture.Install(db, p.cfg.table, notify)
	if err != nil {
		return fmt.Errorf("outboxplugin: watch the pool's transactions: %w", err)
	}
	if p.sqlTx {
		cw.CommitSeparately()
	}
	return p.registerCallbacks(db)
}

// pluginOf returns the plugin registered on db, or nil.
func pluginOf(db *gorm.DB) *Plugin {
	if db == nil || db.Config == nil {
		return nil
	}
	p, _ := db.Config.Plugins[pluginName].(*Plugin)
	return p
}

// PayloadMode chooses what the payload of a captured event holds.
type PayloadMode int

const (
	// PayloadKey, the default, is the primary key keyed by column name: {"id": 42}; a composite key
	// gives one member per key column. It is what the reference design sends: consumers read the
	// current state themselves.
	PayloadKey PayloadMode = iota + 1

	// PayloadRow is the row as the database stored it after the write, every column of the model
	// keyed by column name: read back in the same statement (RETURNING on PostgreSQL and SQLite) or
	// by key in the same transaction (MySQL, MariaDB). Columns the statement did not write (Omit,
	// Select) carry what the row holds, not the values of the Go struct; a column holding NULL is
	// null whatever its Go type; defaults, generated columns and triggers carry what the database
	// stored (a table with triggers that run after RETURNING is read again after the write);
	// expressions (gorm.Expr) carry their result; timestamps carry the precision the database keeps.
	// A delete carries the row as it was when deleted.
	PayloadRow

	// PayloadChanges is the key plus the columns the statement assigned, with the values the database
	// stored (null for NULL): the inserted columns for a create (not the omitted ones), the SET
	// columns for an update (an upsert that updated a row: its DO UPDATE columns), the key alone for a
	// hard delete.
	PayloadChanges
)

func (m PayloadMode) String() string {
	switch m {
	case PayloadKey:
		return "key"
	case PayloadRow:
		return "row"
	case PayloadChanges:
		return "changes"
	}
	return fmt.Sprintf("PayloadMode(%d)", int(m))
}

// Option configures the plugin.
type Option func(*config) error

type config struct {
	table     string
	payload   PayloadMode
	eventType func(Changeset) string
	headers   func(context.Context) map[string]string
	only      map[reflect.Type]bool // nil: every model
	skip      map[reflect.Type]bool
	notify    bool

	strictTables bool
}

func defaultConfig() config {
	return config{table: DefaultTableName, payload: PayloadKey, notify: true}
}

// WithTableName sets the outbox table (default "outbox_events"). It must be a plain identifier,
// optionally schema-qualified ("events.outbox"). Create it with AutoMigrate(db) after db.Use.
func WithTableName(name string) Option {
	return func(c *config) error {
		if !sqlname.Valid(name) {
			return fmt.Errorf("%w: %w: %q", ErrInvalidOption, ErrInvalidTableName, name)
		}
		c.table = name
		return nil
	}
}

// WithPayloadMode sets what captured events carry (default PayloadKey).
func WithPayloadMode(m PayloadMode) Option {
	return func(c *config) error {
		switch m {
		case PayloadKey, PayloadRow, PayloadChanges:
			c.payload = m
			return nil
		}
		return fmt.Errorf("%w: payload mode %d", ErrInvalidOption, int(m))
	}
}

// WithEventType replaces the default event type, "<Model>_<create|update|delete>" (User_create).
// fn is called once per captured row; an empty result is an error that fails the write.
func WithEventType(fn func(Changeset) string) Option {
	return func(c *config) error {
		if fn == nil {
			return fmt.Errorf("%w: WithEventType(nil)", ErrInvalidOption)
		}
		c.eventType = fn
		return nil
	}
}

// WithContextHeaders sets a function that derives event headers from the context of the GORM call
// (db.WithContext(ctx)), for example to carry trace context to consumers. It is called once per
// statement and for each Emit; nil or empty maps store no headers.
func WithContextHeaders(fn func(context.Context) map[string]string) Option {
	return func(c *config) error {
		if fn == nil {
			return fmt.Errorf("%w: WithContextHeaders(nil)", ErrInvalidOption)
		}
		c.headers = fn
		return nil
	}
}

// WithoutNotify stops the PostgreSQL notification the plugin otherwise sends after transactions that
// wrote events commit (pg_notify on a channel named after the outbox table, at most one per 5 ms) to
// wake relays of other processes at once. Turn it off behind PgBouncer in transaction mode, which does
// not carry notifications; relays of other processes then find events by polling. Workers of the
// writer's own process are still woken after each commit, with no notification. Other databases have
// no notifications.
func WithoutNotify() Option {
	return func(c *config) error {
		c.notify = false
		return nil
	}
}

// WithStrictTables makes a write through db.Table(name) without a model fail, with ErrUnknownTable,
// when no model the application uses maps to that table: such a write has no keys to capture, and
// would otherwise commit without events. A Table(...) write to a table a model maps to (migrated,
// queried or written through GORM before, or named in WithModels) is captured as that model's write
// either way.
func WithStrictTables() Option {
	return func(c *config) error {
		c.strictTables = true
		return nil
	}
}

// WithModels restricts capture to the given models (pass values or pointers: &User{}). Writes of
// other models give no events. Calls accumulate.
func WithModels(models ...any) Option {
	return func(c *config) error {
		if c.only == nil {
			c.only = make(map[reflect.Type]bool)
		}
		return addModelTypes(c.only, "WithModels", models)
	}
}

// WithoutModels excludes models from capture (pass values or pointers: &AuditLog{}). Calls
// accumulate; an exclusion wins over WithModels.
func WithoutModels(models ...any) Option {
	return func(c *config) error {
		if c.skip == nil {
			c.skip = make(map[reflect.Type]bool)
		}
		return addModelTypes(c.skip, "WithoutModels", models)
	}
}

func addModelTypes(set map[reflect.Type]bool, opt string, models []any) error {
	for _, m := range models {
		t := reflect.TypeOf(m)
		for t != nil && t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		if t == nil || t.Kind() != reflect.Struct {
			return fmt.Errorf("%w: %s: %T is not a model struct", ErrInvalidOption, opt, m)
		}
		set[t] = true
	}
	return nil
}

// captures reports whether writes of the model with schema s give events under this configuration.
func (c *config) captures(s *schema.Schema) bool {
	t := s.ModelType
	if t == outboxEventType || s.Table == c.table || t.Name() == "" {
		// The outbox itself (no recursion), and GORM's own many-to-many join rows, whose model is
		// an anonymous struct built from the relation.
		return false
	}
	if c.skip[t] {
		return false
	}
	return c.only == nil || c.only[t]
}

var outboxEventType = reflect.TypeFor[OutboxEvent]()

// capture is the configuration the capture runs with: the options, and the hooks through which it
// calls user code with this package's types.
func (c *config) capture() capture.Config {
	cc := capture.Config{
		Table:        c.table,
		Payload:      capture.PayloadMode(c.payload),
		Notify:       c.notify,
		Headers:      c.headers,
		Captures:     c.captures,
		Only:         c.only,
		StrictTables: c.strictTables,
		Customizer:   reflect.TypeFor[EventCustomizer](),
		Customize:    customize,
	}
	if fn := c.eventType; fn != nil {
		cc.EventType = func(cs *capture.Changeset) string { return fn(publicChangeset(cs)) }
	}
	return cc
}

// WithoutCapture returns a context under which the plugin captures nothing: use it for one call
// with db.WithContext(outboxplugin.WithoutCapture(ctx)).Create(&row). Writes made that way commit
// without events, by the caller's choice.
func WithoutCapture(ctx context.Context) context.Context {
	return capture.Suppress(ctx)
}
