package outboxtest_test

import (
	"context"
	"io"
	"net"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/gorm-outbox/outboxplugin/outboxtest"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

func TestFillAndDrain(t *testing.T) {
	db, err := gorm.Open(sqlite.Open(filepath.Join(t.TempDir(), "o.db")+"?_busy_timeout=5000&_journal_mode=WAL"),
		&gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if s, err := db.DB(); err == nil {
			s.Close()
		}
	})
	if err := outboxplugin.AutoMigrate(db); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	events, err := outboxtest.Fill(ctx, db, 2500, outboxtest.FillOptions{Keys: 3, Headers: map[string]string{"h": "v"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(events) != 2500 || events[4].AggregateID != "1" || events[0].MessageID == "" {
		t.Fatalf("unexpected events: %d, %+v", len(events), events[4])
	}
	var (
		mu   sync.Mutex
		seen = map[string]int{}
	)
	pub := outboxplugin.PublisherFunc(func(_ context.Context, msgs []outboxplugin.Message) error {
		mu.Lock()
		defer mu.Unlock()
		for _, m := range msgs {
			seen[m.ID]++
			if m.Headers["h"] != "v" {
				t.Errorf("headers %v", m.Headers)
			}
		}
		return nil
	})
	if _, err := outboxtest.DrainWith(ctx, db, pub, len(events), 2); err != nil {
		t.Fatal(err)
	}
	for _, e := range events {
		if seen[e.MessageID] != 1 {
			t.Fatalf("%s published %d times", e.MessageID, seen[e.MessageID])
		}
	}
	if _, err := outboxtest.DrainWith(ctx, db, pub, 1, 0); err == nil {
		t.Fatal("zero workers accepted")
	}
	short, stop := context.WithTimeout(ctx, 50*time.Millisecond)
	defer stop()
	if _, err := outboxtest.Drain(short, db, pub, 1); err == nil {
		t.Fatal("drain of an empty table ended without error")
	}
}

func TestProxyCutAndRestore(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() { // an echo server
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	p, err := outboxtest.NewProxy(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	echo := func() error {
		c, err := net.DialTimeout("tcp", p.Addr(), time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(time.Second))
		if _, err := c.Write([]byte("ping")); err != nil {
			return err
		}
		buf := make([]byte, 4)
		if _, err := io.ReadFull(c, buf); err != nil {
			return err
		}
		if string(buf) != "ping" {
			t.Errorf("echo %q", buf)
		}
		return nil
	}
	if err := echo(); err != nil {
		t.Fatal(err)
	}
	open, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	if _, err := open.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond) // let the proxy connect it through
	p.Cut()
	_ = open.SetReadDeadline(time.Now().Add(time.Second))
	if _, err := io.ReadAll(open); err != nil {
		t.Fatalf("open connection was not closed by Cut: %v", err)
	}
	if err := echo(); err == nil {
		t.Fatal("a connection went through a cut proxy")
	}
	p.Restore()
	if err := echo(); err != nil {
		t.Fatalf("after Restore: %v", err)
	}
}

func TestRequireBroker(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	outboxtest.RequireBroker(t, "listener", addr) // reachable: goes on
	ln.Close()

	t.Setenv("OUTBOX_REQUIRE_BROKERS", "1")
	ft := &fatalRecorder{TB: t}
	done := make(chan struct{})
	go func() { // Fatalf ends the goroutine that calls it
		defer close(done)
		outboxtest.RequireBroker(ft, "closed listener", addr)
	}()
	<-done
	if !ft.fatal {
		t.Fatal("an unreachable broker did not fail the test with OUTBOX_REQUIRE_BROKERS=1")
	}
}

// fatalRecorder records Fatalf instead of failing the test.
type fatalRecorder struct {
	testing.TB
	fatal bool
}

func (f *fatalRecorder) Helper() {}
func (f *fatalRecorder) Fatalf(string, ...any) {
	f.fatal = true
	runtime.Goexit()
}

func TestProxyMute(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	received := make(chan string, 4)
	go func() { // an echo server that also reports what it received
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 64)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						received <- string(buf[:n])
						_, _ = c.Write(buf[:n])
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	p, err := outboxtest.NewProxy(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	p.Mute(true)
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-received:
		if got != "ping" {
			t.Fatalf("server received %q", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a muted proxy held back what the client sent")
	}
	_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	buf := make([]byte, 4)
	if n, err := c.Read(buf); err == nil {
		t.Fatalf("a muted proxy let the answer %q through", buf[:n])
	}
	p.Mute(false)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("after Mute(false): %q, %v", buf, err)
	}
}

// A black-holed proxy forwards nothing either way and closes nothing — open connections and new
// ones alike — and delivers what waited once the black hole ends.
func TestProxyBlackhole(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	received := make(chan string, 8)
	go func() { // an echo server that also reports what it received
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 64)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						received <- string(buf[:n])
						_, _ = c.Write(buf[:n])
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	p, err := outboxtest.NewProxy(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	open, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()

	p.Blackhole(true)
	fresh, err := net.DialTimeout("tcp", p.Addr(), 5*time.Second) // accepted, never answered
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	for _, c := range []net.Conn{open, fresh} {
		if _, err := c.Write([]byte("ping")); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case got := <-received:
		t.Fatalf("the server received %q through a black hole", got)
	case <-time.After(200 * time.Millisecond):
	}
	for _, c := range []net.Conn{open, fresh} {
		_ = c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		buf := make([]byte, 4)
		if n, err := c.Read(buf); err == nil || n > 0 {
			t.Fatalf("a black hole answered %q", buf[:n])
		} else if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
			t.Fatalf("a black hole closed the connection: %v", err)
		}
	}
	p.Blackhole(false)
	for _, c := range []net.Conn{open, fresh} {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 4)
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
			t.Fatalf("after Blackhole(false): %q, %v", buf, err)
		}
	}
}
