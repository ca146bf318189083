// Package msgid makes and reads the message ids of outbox events: UUIDv7 (RFC 9562, section 5.7), a
// 48-bit Unix millisecond timestamp, the version, a 12-bit counter in rand_a that keeps the ids of one
// process increasing within a millisecond (the "fixed bit-length dedicated counter" of section 6.2,
// method 1), the variant, and 62 random bits. Written by hand rather than imported because the core
// module depends on gorm.io/gorm alone. The capture and Emit make ids; the Admin reads their time.
package msgid

import (
	"crypto/rand"
	"encoding/hex"
	"sync"
	"time"
)

var clock struct {
	sync.Mutex
	ms  int64  // last timestamp used
	seq uint16 // counter within ms, 12 bits
}

// New returns a new UUIDv7 in its 36-character text form.
func New() string {
	return newAt(time.Now().UnixMilli())
}

// newAt is New at the Unix millisecond nowMS.
func newAt(nowMS int64) string {
	var b [16]byte
	// crypto/rand.Read never returns an error (Go 1.24+); it crashes the program instead.
	_, _ = rand.Read(b[8:])

	ms, seq := nextTick(nowMS)
	b[0] = byte(ms >> 40)
	b[1] = byte(ms >> 32)
	b[2] = byte(ms >> 24)
	b[3] = byte(ms >> 16)
	b[4] = byte(ms >> 8)
	b[5] = byte(ms)
	b[6] = 0x70 | byte(seq>>8)&0x0f
	b[7] = byte(seq)
	b[8] = 0x80 | b[8]&0x3f
	return format(b)
}

// nextTick returns the timestamp and counter for the next id: the counter increases within a
// millisecond and, when it would overflow or the clock steps back, the timestamp moves forward by
// one, so ids of one process never repeat and always increase.
func nextTick(nowMS int64) (int64, uint16) {
	c := &clock
	c.Lock()
	defer c.Unlock()
	switch {
	case nowMS > c.ms:
		c.ms = nowMS
		c.seq = 0
	case c.seq < 0x0fff:
		c.seq++
	default:
		c.ms++
		c.seq = 0
	}
	return c.ms, c.seq
}

func format(b [16]byte) string {
	const hexDigits = "0123456789abcdef"
	var out [36]byte
	j := 0
	for i, v := range b {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			out[j] = '-'
			j++
		}
		out[j] = hexDigits[v>>4]
		out[j+1] = hexDigits[v&0x0f]
		j += 2
	}
	return string(out[:])
}

// Time returns the timestamp of a UUIDv7 in its text form, and false for text that is not one.
func Time(id string) (time.Time, bool) {
	if len(id) != 36 || id[8] != '-' || id[13] != '-' || id[14] != '7' {
		return time.Time{}, false
	}
	var b [6]byte
	if _, err := hex.Decode(b[:4], []byte(id[:8])); err != nil {
		return time.Time{}, false
	}
	if _, err := hex.Decode(b[4:], []byte(id[9:13])); err != nil {
		return time.Time{}, false
	}
	ms := int64(b[0])<<40 | int64(b[1])<<32 | int64(b[2])<<24 | int64(b[3])<<16 | int64(b[4])<<8 | int64(b[5])
	return time.UnixMilli(ms).UTC(), true
}
