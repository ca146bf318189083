package reliability_test

// Broker outage (item 2 of the reliability suite). A writer commits orders through the plugin at a
// steady rate on PostgreSQL while a worker relays them through one of the project's publishers to a
// real broker, over an outboxtest.Proxy on loopback. The test cuts the proxy for a few seconds (every
// connection dropped, new ones refused) and restores it, under load, and asserts:
//
//   - nothing is lost: every event reaches the broker at least once (JetStream: exactly once, thanks to
//     Nats-Msg-Id), every committed order has exactly one event, and no event exists without its order;
//   - the outage costs no event an attempt: the publishers report what the cut broker did not get as not
//     delivered (outboxplugin.ErrBrokerUnavailable), so the worker gives each such delivery its attempt
//     back — no delivery is refused, no event is dead, and every event ends published on its first
//     attempt;
//   - the backlog drains after the broker returns, as soon as the retry backoff lets it: within the
//     latest next-attempt time of the backlog at the restore plus a few seconds;
//   - the worker backs off while the broker is down: its log lines stay at a few per second of outage,
//     and the process's CPU time (syscall.Getrusage) stays well under one core.
//
// OUTBOX_SOAK (1, or a duration) repeats outages of 2–30 s for that long.

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/gorm-outbox/outboxplugin/outboxtest"
	outboxnats "github.com/gorm-outbox/outboxplugin/publishers/nats"
	outboxrabbitmq "github.com/gorm-outbox/outboxplugin/publishers/rabbitmq"
	"github.com/gorm-outbox/outboxplugin/reliability"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
)

// faultOutageBroker is a real broker reached through a proxy the test can cut.
type faultOutageBroker struct {
	name  string
	proxy *outboxtest.Proxy
	pub   outboxplugin.Publisher
	// exactlyOnce: the broker drops a copy of a message it already holds (JetStream's Nats-Msg-Id).
	exactlyOnce bool
	// delivered returns the copies of each message id the broker holds or delivered, once it holds
	// or delivered want distinct messages (or its wait ran out).
	delivered func(ctx context.Context, tb testing.TB, want int) map[string]int
}

// TestBrokerOutageNATS runs the outage scenario through publishers/nats to a JetStream stream of its own.
func TestBrokerOutageNATS(t *testing.T) {
	faultRunOutage(t, faultNATSBroker(t))
}

// TestBrokerOutageRabbitMQ runs the outage scenario through publishers/rabbitmq to an exchange and a
// queue of its own.
func TestBrokerOutageRabbitMQ(t *testing.T) {
	faultRunOutage(t, faultRabbitBroker(t))
}

// faultRunOutage is the outage scenario, on PostgreSQL, with broker b.
func faultRunOutage(t *testing.T, b *faultOutageBroker) {
	soak := faultSoak(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second+2*soak)
	defer cancel()

	writerDB := faultOpenPostgres(t, "fault_outage_writer")
	faultResetTables(t, writerDB)
	relayDB := faultOpenPostgres(t, "fault_outage_relay")

	logs := faultNewLogCounter()
	obs := &faultOutageObserver{}
	const batch = outboxplugin.DefaultBatchSize
	// The worker runs with its defaults (poll 1 s, LISTEN wake-up, retry policy 1 s doubling to 5 min,
	// publish timeout 30 s, lease 2 min): the backoff under test is the one users get.
	worker, err := outboxplugin.NewWorker(relayDB, b.pub,
		outboxplugin.WithTable(faultOutboxTable),
		outboxplugin.WithLogger(slog.New(logs)),
		outboxplugin.WithObserver(obs))
	if err != nil {
		t.Fatal(err)
	}
	stopWorker := faultRunWorkers(ctx, t, worker)
	writer := faultStartWriter(ctx, writerDB, 10*time.Millisecond)
	defer writer.Stop()

	downs := []time.Duration{3 * time.Second}
	if soak > 0 {
		downs = nil
		for total := time.Duration(0); total < soak; {
			d := time.Duration(2+rand.IntN(29)) * time.Second
			downs = append(downs, d)
			total += d + 5*time.Second
		}
	}

	var (
		drains          []time.Duration
		logsPerSec      []float64
		downTotal       time.Duration
		logsTotal       int
		maxCPUDown      float64
		maxCPUUp        float64
		backlogAtReturn int64
	)
	for cycle, down := range downs {
		// Load flows before the cut: events keep arriving at the broker.
		before := obs.published.Load()
		faultWaitFor(ctx, t, 20*time.Second, b.name+": events flowing before the cut", func() bool {
			return obs.published.Load() >= before+50
		})
		cpuUp0, upStart := faultCPUTime(t), time.Now()
		time.Sleep(time.Second)
		cpuUp := float64(faultCPUTime(t)-cpuUp0) / float64(time.Since(upStart))
		maxCPUUp = max(maxCPUUp, cpuUp)

		logs0, cpu0, commits0, cutAt := logs.Total(), faultCPUTime(t), writer.Committed(), time.Now()
		b.proxy.Cut()
		time.Sleep(down)
		logs1, cpu1, commits1, restoreAt := logs.Total(), faultCPUTime(t), writer.Committed(), time.Now()
		window := restoreAt.Sub(cutAt)

		// What the restore has to drain: the events written up to now, and when they are due.
		var atRestore struct {
			MaxID   int64
			MaxNext *time.Time
			Pending int64
		}
		if err := relayDB.WithContext(ctx).Table(faultOutboxTable).
			Select("MAX(id) AS max_id, MAX(next_attempt_at) AS max_next, SUM(CASE WHEN processed THEN 0 ELSE 1 END) AS pending").
			Scan(&atRestore).Error; err != nil {
			t.Fatalf("read the backlog: %v", err)
		}
		b.proxy.Restore()
		backlogAtReturn = max(backlogAtReturn, atRestore.Pending)

		logLines := logs1 - logs0
		cpuDown := float64(cpu1-cpu0) / float64(window)
		maxCPUDown = max(maxCPUDown, cpuDown)
		downTotal += window
		logsTotal += logLines
		logsPerSec = append(logsPerSec, float64(logLines)/window.Seconds())

		drain := faultWaitFor(ctx, t, 60*time.Second+down, b.name+": backlog drained after the restore", func() bool {
			var n int64
			err := relayDB.WithContext(ctx).Table(faultOutboxTable).
				Where("id <= ? AND processed = ?", atRestore.MaxID, false).Count(&n).Error
			return err == nil && n == 0
		})
		drains = append(drains, drain)

		// Bounds. The log: one line per failed batch; with the worker backing off, a few a second
		// whatever the write rate — allow three a second plus a few for the cut and the
		// reconnection. CPU: the writer's load, the relay's retries and the client's reconnects,
		// well under one core (a worker spinning on a dead broker takes a core of its own; under
		// -race the writer alone takes about 0.4).
		if limit := 3*window.Seconds() + 5; float64(logLines) > limit {
			t.Errorf("cycle %d: %d log lines during %v of outage (limit %.0f) while the writer committed %d events: "+
				"the worker does not back off from a broker that is down, it tries again (and logs) at every wake-up; records: %s",
				cycle, logLines, window.Round(time.Millisecond), limit, commits1-commits0, logs.Messages())
		}
		if cpuDown > 0.75 {
			t.Errorf("cycle %d: the process used %.2f of a core during the outage (limit 0.75); %.2f before it", cycle, cpuDown, cpuUp)
		}
		due := time.Duration(0)
		if atRestore.MaxNext != nil {
			due = max(0, atRestore.MaxNext.Sub(restoreAt))
		}
		if limit := due + 10*time.Second; drain > limit {
			t.Errorf("cycle %d: the backlog took %v to drain after the restore; its last event was due %v after it (limit %v)",
				cycle, drain.Round(time.Millisecond), due.Round(time.Millisecond), limit)
		}
		t.Logf("outage %d: down %v, %d log lines, cpu %.3f (%.3f before), backlog %d due within %v, drained in %v",
			cycle, window.Round(time.Millisecond), logLines, cpuDown, cpuUp, atRestore.Pending,
			due.Round(time.Millisecond), drain.Round(time.Millisecond))
	}

	writer.Stop()
	faultWaitFor(ctx, t, 60*time.Second, b.name+": every event published", func() bool {
		n, err := faultPending(ctx, relayDB)
		return err == nil && n == 0
	})
	stopWorker()
	refused, notDelivered := obs.failed.Load(), obs.notDelivered.Load()
	if refused+notDelivered == 0 {
		t.Errorf("no delivery failed: the outage did not reach the publisher")
	}
	if refused > 0 {
		t.Errorf("%d deliveries refused: the publisher took a cut connection for a refusal, and spent attempts on it", refused)
	}
	if n := obs.dead.Load(); n > 0 {
		t.Errorf("%d events dead after an outage", n)
	}
	events := faultEvents(ctx, t, relayDB)
	spent := 0
	for _, e := range events {
		if e.Attempts != 1 {
			spent++
		}
	}
	if spent > 0 {
		t.Errorf("%d of %d events published with attempts other than 1: the outage spent attempts", spent, len(events))
	}

	delivered := b.delivered(ctx, t, len(events))
	tally := faultCheck(ctx, t, writerDB, writer, delivered)
	_, inDoubt, lastErr := writer.Outcome()
	if inDoubt > 0 {
		t.Errorf("%d writes failed although only the broker was cut; last: %v", inDoubt, lastErr)
	}
	inFlight := len(downs) * 2 * batch // a worker holds at most two batches at each cut
	if b.exactlyOnce && tally.Duplicates != 0 {
		t.Errorf("%d duplicates in a broker that de-duplicates by message id", tally.Duplicates)
	}
	if tally.Duplicates > inFlight {
		t.Errorf("%d duplicates, more than the %d events in flight at the cuts", tally.Duplicates, inFlight)
	}
	var rate float64
	for _, r := range logsPerSec {
		rate = max(rate, r)
	}
	// retried counts the failed deliveries the worker retried: refused (an attempt spent each) and
	// not delivered (the attempt given back); spent, the events that needed more than one attempt.
	t.Logf("FIGURES outage/%s events=%d orders=%d cuts=%d down=%v lost=%d phantoms=%d dup=%d inflight_bound=%d "+
		"retried=%d refused=%d not_delivered=%d spent=%d dead=%d backlog=%d drain=%s logs=%d logs_per_s=%.2f cpu_down=%.3f cpu_up=%.3f",
		b.name, tally.Events, tally.Orders, len(downs), downTotal.Round(time.Millisecond), tally.Lost, tally.Phantoms,
		tally.Duplicates, inFlight, refused+notDelivered, refused, notDelivered, spent, obs.dead.Load(), backlogAtReturn,
		faultDurations(drains), logsTotal, rate, maxCPUDown, maxCPUUp)
}

// faultOutageObserver is faultSuccess (its failed counts the refused deliveries, BatchResult.Failed)
// that also counts the deliveries not made (BatchResult.NotDelivered, the attempt given back) and the
// events given up on.
type faultOutageObserver struct {
	faultSuccess
	notDelivered atomic.Int64
	dead         atomic.Int64
}

func (o *faultOutageObserver) BatchDone(ctx context.Context, r outboxplugin.BatchResult) {
	o.faultSuccess.BatchDone(ctx, r)
	o.notDelivered.Add(int64(len(r.NotDelivered)))
}

func (o *faultOutageObserver) Dead(context.Context, outboxplugin.Message, error) { o.dead.Add(1) }

// faultNATSURL is the NATS server: OUTBOX_NATS_URL or the local one.
func faultNATSURL() string {
	if u := os.Getenv("OUTBOX_NATS_URL"); u != "" {
		return u
	}
	return "nats://127.0.0.1:4222"
}

// faultNATSBroker sets up a JetStream stream of the test's own, a proxy to the server, and the
// project's NATS publisher on a connection through the proxy that reconnects for ever (as its README
// recommends). The stream is deleted when the test ends.
func faultNATSBroker(t *testing.T) *faultOutageBroker {
	t.Helper()
	addr := strings.TrimPrefix(faultNATSURL(), "nats://")
	outboxtest.RequireBroker(t, "NATS", addr)
	admin, err := nats.Connect(faultNATSURL())
	if err != nil {
		t.Fatalf("NATS at %s: %v", faultNATSURL(), err)
	}
	t.Cleanup(admin.Close)
	adminJS, err := jetstream.New(admin)
	if err != nil {
		t.Fatal(err)
	}
	stream, prefix := reliability.RunName("outage_stream"), reliability.RunName("outage_subject")
	setup, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := adminJS.CreateStream(setup, jetstream.StreamConfig{
		Name: stream, Subjects: []string{prefix + ".>"}, Duplicates: 10 * time.Minute,
	})
	if err != nil {
		t.Fatalf("create stream %s: %v", stream, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := adminJS.DeleteStream(ctx, stream); err != nil {
			t.Errorf("delete stream %s: %v", stream, err)
		}
	})

	proxy, err := outboxtest.NewProxy(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	nc, err := nats.Connect("nats://"+proxy.Addr(), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatalf("NATS through the proxy: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	pub, err := outboxnats.New(js,
		outboxnats.WithSubject(func(m outboxplugin.Message) string { return prefix + "." + outboxnats.DefaultSubject(m) }),
		outboxnats.WithExpectedStream(stream))
	if err != nil {
		t.Fatal(err)
	}
	return &faultOutageBroker{
		name: "nats", proxy: proxy, pub: pub, exactlyOnce: true,
		delivered: func(ctx context.Context, tb testing.TB, _ int) map[string]int {
			tb.Helper()
			// The stream is the record: everything it acknowledged is stored in it.
			info, err := s.Info(ctx)
			if err != nil {
				tb.Fatalf("stream info: %v", err)
			}
			want := int(info.State.Msgs)
			cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
			if err != nil {
				tb.Fatalf("stream consumer: %v", err)
			}
			seen := make(map[string]int, want)
			for read := 0; read < want; {
				msgs, err := cons.Fetch(min(want-read, 1000), jetstream.FetchMaxWait(5*time.Second))
				if err != nil {
					tb.Fatalf("read the stream: %v", err)
				}
				before := read
				for m := range msgs.Messages() {
					seen[m.Headers().Get(jetstream.MsgIDHeader)]++
					read++
				}
				if err := msgs.Error(); err != nil {
					tb.Fatalf("read the stream: %v", err)
				}
				if read == before {
					tb.Fatalf("read the stream: stuck at %d of %d messages", read, want)
				}
			}
			return seen
		},
	}
}

// faultRabbitURL is the RabbitMQ broker: OUTBOX_RABBITMQ_URL or the local one.
func faultRabbitURL() string {
	if u := os.Getenv("OUTBOX_RABBITMQ_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

// faultRabbitBroker sets up an exchange and a queue of the test's own with a consumer that counts the
// deliveries of each message id (on a connection of its own, not through the proxy), a proxy to the
// broker, and the project's RabbitMQ publisher through the proxy. Everything is deleted when the test
// ends.
func faultRabbitBroker(t *testing.T) *faultOutageBroker {
	t.Helper()
	uri, err := amqp.ParseURI(faultRabbitURL())
	if err != nil {
		t.Fatalf("OUTBOX_RABBITMQ_URL: %v", err)
	}
	addr := net.JoinHostPort(uri.Host, strconv.Itoa(uri.Port))
	outboxtest.RequireBroker(t, "RabbitMQ", addr)
	conn, err := amqp.Dial(faultRabbitURL())
	if err != nil {
		t.Fatalf("RabbitMQ at %s: %v", addr, err)
	}
	name := reliability.RabbitName("outage")
	consumed := make(chan struct{})
	// Registered before anything is declared, so that a failed setup leaves nothing (deleting what
	// does not exist succeeds); the connection is closed after the deletions.
	t.Cleanup(func() {
		admin, err := conn.Channel()
		if err == nil {
			if _, err = admin.QueueDelete(name, false, false, false); err == nil {
				err = admin.ExchangeDelete(name, false, false)
			}
		}
		if err != nil {
			t.Errorf("delete queue and exchange %s: %v", name, err)
		}
		conn.Close()
		<-consumed
	})
	ch, err := conn.Channel()
	if err != nil {
		close(consumed)
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare(name, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		close(consumed)
		t.Fatalf("declare exchange %s: %v", name, err)
	}
	if _, err := ch.QueueDeclare(name, true, false, false, false, nil); err != nil {
		close(consumed)
		t.Fatalf("declare queue %s: %v", name, err)
	}
	if err := ch.QueueBind(name, "#", name, false, nil); err != nil {
		close(consumed)
		t.Fatalf("bind queue %s: %v", name, err)
	}
	deliveries, err := ch.Consume(name, "", true, false, false, false, nil)
	if err != nil {
		close(consumed)
		t.Fatal(err)
	}
	var (
		mu   sync.Mutex
		seen = map[string]int{}
	)
	go func() {
		defer close(consumed)
		for d := range deliveries {
			mu.Lock()
			seen[d.MessageId]++
			mu.Unlock()
		}
	}()

	proxy, err := outboxtest.NewProxy(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	host, port, _ := net.SplitHostPort(proxy.Addr())
	viaProxy := uri
	viaProxy.Host = host
	viaProxy.Port, _ = strconv.Atoi(port)
	pub, err := outboxrabbitmq.Dial(viaProxy.String(), outboxrabbitmq.WithExchange(name))
	if err != nil {
		t.Fatalf("RabbitMQ through the proxy: %v", err)
	}
	t.Cleanup(func() { pub.Close() })
	return &faultOutageBroker{
		name: "rabbitmq", proxy: proxy, pub: pub,
		delivered: func(ctx context.Context, tb testing.TB, want int) map[string]int {
			tb.Helper()
			// Everything the broker confirmed is in the queue: give the consumer time to read it all
			// (a shortfall is reported as lost events by the caller).
			unique := func() int {
				mu.Lock()
				defer mu.Unlock()
				return len(seen)
			}
			deadline := time.Now().Add(30 * time.Second)
			for unique() < want && time.Now().Before(deadline) && ctx.Err() == nil {
				time.Sleep(10 * time.Millisecond)
			}
			mu.Lock()
			defer mu.Unlock()
			out := make(map[string]int, len(seen))
			for k, v := range seen {
				out[k] = v
			}
			return out
		},
	}
}
