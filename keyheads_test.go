package outboxplugin

import (
	"testing"
)

// pickKeyHeads is per-key ordering's decision on MySQL/MariaDB. Each case names the rows the claim saw
// in its snapshot (id: key), the rows it locked as they are now, and the ids it must hand out.
func TestPickKeyHeads(t *testing.T) {
	cand := func(id int64, key string) candidate { return candidate{id: id, key: key} }
	row := func(id int64, flags string) keyedRow {
		r := keyedRow{claimedRow: claimedRow{id: id}, due: true}
		for _, f := range flags {
			switch f {
			case 'p':
				r.processed = true
			case 'd':
				r.dead = true
			case 'l':
				r.leased = true
			case 'w': // waiting: scheduled later, not due
				r.due = false
			}
		}
		return r
	}
	for _, tc := range []struct {
		name   string
		cands  []candidate
		seen   map[int64]string
		locked []keyedRow
		batch  int
		want   []int64
	}{
		{
			name:   "the first unprocessed row of each key, once",
			cands:  []candidate{cand(1, "a"), cand(2, "a"), cand(3, "b")},
			seen:   map[int64]string{1: "a", 2: "a", 3: "b"},
			locked: []keyedRow{row(1, ""), row(2, ""), row(3, "")},
			batch:  10, want: []int64{1, 3},
		},
		{
			name:   "a key with a row locked by another relay is left to it",
			cands:  []candidate{cand(1, "a"), cand(3, "b")},
			seen:   map[int64]string{1: "a", 2: "a", 3: "b"},
			locked: []keyedRow{row(1, ""), row(3, "")}, // 2 skipped: locked elsewhere
			batch:  10, want: []int64{3},
		},
		{
			name:   "a key leased by a claim committed after the snapshot is in flight",
			cands:  []candidate{cand(2, "a")},
			seen:   map[int64]string{1: "a", 2: "a"},
			locked: []keyedRow{row(1, "l"), row(2, "")},
			batch:  10, want: nil,
		},
		{
			name:   "a head finished since the snapshot lets the next row out",
			cands:  []candidate{cand(1, "a"), cand(2, "a")},
			seen:   map[int64]string{1: "a", 2: "a"},
			locked: []keyedRow{row(1, "p"), row(2, "")},
			batch:  10, want: []int64{2},
		},
		{
			name:   "a dead head holds its key back; a head scheduled later too",
			cands:  []candidate{cand(2, "a"), cand(4, "b")},
			seen:   map[int64]string{1: "a", 2: "a", 3: "b", 4: "b"},
			locked: []keyedRow{row(1, "d"), row(2, ""), row(3, "w"), row(4, "")},
			batch:  10, want: nil,
		},
		{
			name:   "events of no key go out while pending, and count against the batch",
			cands:  []candidate{cand(1, ""), cand(2, ""), cand(3, "a"), cand(4, "")},
			seen:   map[int64]string{1: "", 2: "", 3: "a", 4: ""},
			locked: []keyedRow{row(1, ""), row(2, "l"), row(3, "")},
			batch:  2, want: []int64{1, 3},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := pickKeyHeads(tc.cands, tc.seen, tc.locked, tc.batch)
			var ids []int64
			for _, r := range got {
				ids = append(ids, r.id)
			}
			if len(ids) != len(tc.want) {
				t.Fatalf("picked %v, want %v", ids, tc.want)
			}
			for i := range ids {
				if ids[i] != tc.want[i] {
					t.Fatalf("picked %v, want %v", ids, tc.want)
				}
			}
		})
	}
}
