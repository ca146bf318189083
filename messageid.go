package outboxplugin

import (
	"crypto/rand"
	"sync"
	"time"
)

// The message id is a UUIDv7 (RFC 9562, section 5.7): a 48-bit Unix millisecond timestamp, the
// version, a 12-bit counter in rand_a that keeps ids of one process increasing within a millisecond
// (the "fixed bit-length dedicated counter" of section 6.2, method 1), the variant, and 62 random
// bits. It is written by hand rather than imported because the core module depends on gorm.io/gorm
// alone; it is tested against the RFC's layout.

var messageIDClock struct {
	sync.Mutex
	ms  int64  // last timestamp used
	seq uint16 // counter within ms, 12 bits
}

// newMessageID returns a new UUIDv7 in its 36-character text form.
func newMessageID() string {
	var b [16]byte
	// crypto/rand.Read never returns an error (Go 1.24+); it crashes the program instead.
	_, _ = rand.Read(b[8:])

	ms, seq := nextMessageIDTick(time.Now().UnixMilli())
	b[0] = byte(ms >> 40)
	b[1] = byte(ms >> 32)
	b[2] = byte(ms >> 24)
	b[3] = byte(ms >> 16)
	b[4] = byte(ms >> 8)
	b[5] = byte(ms)
	b[6] = 0x70 | byte(seq>>8)&0x0f
	b[7] = byte(seq)
	b[8] = 0x80 | b[8]&0x3f
	return formatUUID(b)
}

// nextMessageIDTick returns the timestamp and counter for the next id: the counter increases within a
// millisecond and, when it would overflow or the clock steps back, the timestamp moves forward by
// one, so ids of one process never repeat and always increase.
func nextMessageIDTick(nowMS int64) (int64, uint16) {
	c := &messageIDClock
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

func formatUUID(b [16]byte) string {
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
