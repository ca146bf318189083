package capture

import (
	"reflect"
	"sort"
	"sync"
	"unsafe"

	"gorm.io/gorm"
	"gorm.io/gorm/schema"
)

// A write through db.Table("users") with a map has no model: GORM runs it with no schema, so on its
// own it says nothing of the rows' keys. When the application uses a model for that table — it
// migrated it, queried or wrote it through GORM, or named it in WithModels — the plugin captures the
// write as a write of that model (GORM's own statement is left without a schema, exactly as it was).

// modelTables maps table names to the models the application uses for them.
type modelTables struct {
	seen sync.Map // table -> *schema.Schema, from statements the plugin saw with a model
}

// remember notes the model a statement wrote table with.
func (t *modelTables) remember(s *schema.Schema, table string) {
	if table == "" {
		table = s.Table
	}
	if _, ok := t.seen.Load(table); !ok {
		t.seen.LoadOrStore(table, s)
	}
}

// lookup returns the model of table: one named in WithModels, else the first the plugin saw written to
// it, else one GORM has parsed (by a migration, a query, a relation), or nil. Models are tried in a
// fixed order (WithModels first, then by type name) when several map to one table.
func (t *modelTables) lookup(db *gorm.DB, only map[reflect.Type]bool, table string) *schema.Schema {
	for _, typ := range sortedTypes(only) {
		if s := parseModel(db, typ, ""); s != nil && s.Table == table {
			return s
		}
	}
	if v, ok := t.seen.Load(table); ok {
		return v.(*schema.Schema)
	}
	cache := gormSchemaCache(db)
	if cache == nil {
		return nil
	}
	type candidate struct {
		typ     reflect.Type
		special string
	}
	var found []candidate
	cache.Range(func(key, value any) bool {
		// ModelType and Table are set before GORM publishes a schema in its cache; the rest is read
		// only after parseModel has waited for the schema to be complete.
		if s, ok := value.(*schema.Schema); ok && s.Table == table && s.ModelType != nil && s.ModelType.Name() != "" {
			c := candidate{typ: s.ModelType}
			if _, ok := key.(string); ok {
				c.special = table // parsed for db.Table(name).AutoMigrate(&Model{}) and the like
			}
			found = append(found, c)
		}
		return true
	})
	sort.Slice(found, func(i, j int) bool { return found[i].typ.String() < found[j].typ.String() })
	for _, c := range found {
		if s := parseModel(db, c.typ, c.special); s != nil && s.Table == table {
			t.remember(s, table)
			return s
		}
	}
	return nil
}

func parseModel(db *gorm.DB, typ reflect.Type, special string) *schema.Schema {
	stmt := &gorm.Statement{DB: db}
	if err := stmt.ParseWithSpecialTableName(reflect.New(typ).Interface(), special); err != nil {
		return nil
	}
	return stmt.Schema
}

func sortedTypes(set map[reflect.Type]bool) []reflect.Type {
	types := make([]reflect.Type, 0, len(set))
	for t := range set {
		types = append(types, t)
	}
	sort.Slice(types, func(i, j int) bool { return types[i].String() < types[j].String() })
	return types
}

// gormSchemaCache returns the cache of parsed models GORM keeps per *gorm.DB (gorm.Config.cacheStore,
// unexported), or nil if this GORM version keeps it elsewhere. It is only read.
func gormSchemaCache(db *gorm.DB) *sync.Map {
	if db.Config == nil {
		return nil
	}
	f := reflect.ValueOf(db.Config).Elem().FieldByName("cacheStore")
	if !f.IsValid() || f.Type() != reflect.TypeFor[*sync.Map]() {
		return nil
	}
	return *(**sync.Map)(unsafe.Pointer(f.UnsafeAddr()))
}
