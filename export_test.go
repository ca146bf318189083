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
