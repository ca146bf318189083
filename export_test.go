package outboxplugin

// UseInsertStrategy makes p write events with the named strategy ("values" or "unnest"), so that
// benchmarks can compare them on one database.
func UseInsertStrategy(p *Plugin, name string) {
	for _, s := range []insertStrategy{insertValues, insertUnnest} {
		if s.String() == name {
			p.insertStrategy = s
			return
		}
	}
	panic("unknown insert strategy " + name)
}

// UseLockedWrites makes p run updates and deletes by condition as a locked read and a write by key,
// the way it does where the database has no RETURNING (MySQL, SQLite before 3.35), so that tests run
// that path on every database.
func UseLockedWrites(p *Plugin) { p.lockedWrites = true }
