package outboxrabbitmq

import (
	"fmt"
	"sync"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	amqp "github.com/rabbitmq/amqp091-go"
)

// closeReasonWait bounds how long closed waits for the reason of a close in progress.
const closeReasonWait = time.Second

// session is one confirm-mode channel and the goroutine that watches it: it records the channel's
// close reason and, for mandatory publishing, the messages the broker returned. A session is never
// reused once its channel has closed; the publisher opens a new one.
type session struct {
	ch        *amqp.Channel
	mandatory bool

	closes  chan *amqp.Error
	returns chan amqp.Return
	barrier chan struct{}
	done    chan struct{} // closed when watch ends, after the channel has closed

	mu       sync.Mutex
	closeErr *amqp.Error
	// waiting holds the IDs of the messages in flight of every Publish using this session (mandatory
	// publishing only), each with the error of its return, or nil while it was not returned. Returns
	// for other IDs — of a Publish that already gave up — are dropped.
	waiting map[string]error
}

// openSession opens a channel on conn, puts it in confirm mode and starts watching it.
func openSession(conn *amqp.Connection, mandatory bool) (*session, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("outboxrabbitmq: open channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("outboxrabbitmq: confirm mode: %w", err)
	}
	s := &session{
		ch:        ch,
		mandatory: mandatory,
		// Buffered: the library delivers the close reason without blocking, or in a goroutine of its
		// own when the buffer is full.
		closes:  ch.NotifyClose(make(chan *amqp.Error, 1)),
		barrier: make(chan struct{}),
		done:    make(chan struct{}),
		waiting: map[string]error{},
	}
	if mandatory {
		// Unbuffered on purpose: the connection's reader hands a return over only when watch takes
		// it, and the broker sends a message's basic.return before its basic.ack. So once a
		// confirmation is seen, the return that preceded it is in watch's hands, and sync makes sure
		// it is recorded.
		s.returns = ch.NotifyReturn(make(chan amqp.Return))
	}
	go s.watch()
	return s, nil
}

// watch runs until the channel closes: the library closes every notification channel then.
func (s *session) watch() {
	defer close(s.done)
	returns := s.returns
	for {
		select {
		case e, ok := <-s.closes:
			if !ok {
				return
			}
			s.mu.Lock()
			s.closeErr = e
			s.mu.Unlock()
		case r, ok := <-returns:
			if !ok {
				returns = nil
				continue
			}
			s.mu.Lock()
			if _, ok := s.waiting[r.MessageId]; ok {
				s.waiting[r.MessageId] = fmt.Errorf("%w: %w: %d %s (exchange %q, routing key %q)",
					ErrUnroutable, outboxplugin.ErrMisconfigured, r.ReplyCode, r.ReplyText, r.Exchange, r.RoutingKey)
			}
			s.mu.Unlock()
		case <-s.barrier:
		}
	}
}

// sync returns once watch has recorded every return it received before the call. watch handles
// one event at a time, so by the time it takes from barrier it is done with the earlier ones.
func (s *session) sync() {
	select {
	case s.barrier <- struct{}{}:
	case <-s.done:
	}
}

// register marks ids as in flight, so that watch records their returns.
func (s *session) register(ids []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		s.waiting[id] = nil
	}
}

// unregister forgets ids and returns the errors of those that were returned.
func (s *session) unregister(ids []string) map[string]error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var returned map[string]error
	for _, id := range ids {
		if err := s.waiting[id]; err != nil {
			if returned == nil {
				returned = map[string]error{}
			}
			returned[id] = err
		}
		delete(s.waiting, id)
	}
	return returned
}

// closed reports whether the channel has closed and why: the broker's or the library's reason, or nil
// for a close the client asked for. The library closes the notification channels before it fails the
// pending confirmations, so for a confirmation failed by the close, watch is about to end; the wait
// for it is bounded all the same.
func (s *session) closed() (bool, *amqp.Error) {
	if !s.ch.IsClosed() {
		return false, nil
	}
	t := time.NewTimer(closeReasonWait)
	defer t.Stop()
	select {
	case <-s.done:
	case <-t.C:
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return true, s.closeErr
}
