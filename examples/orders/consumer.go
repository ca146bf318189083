package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// notifier is the consumer: it reads the order events from the stream and records a notification
// for each OrderPlaced and OrderCancelled, exactly once per message id although JetStream delivers
// at least once.
type notifier struct {
	db     *gorm.DB
	tracer trace.Tracer
	logger *slog.Logger
}

// handleTimeout bounds the handling of one message; past it the message is nakked and redelivered.
const handleTimeout = 10 * time.Second

// consume handles each message the consumer delivers until the returned context is drained.
// Handling does not stop with the service's context: Drain lets the messages already delivered
// finish, and each is bounded by handleTimeout.
func (n *notifier) consume(ctx context.Context, cons jetstream.Consumer) (jetstream.ConsumeContext, error) {
	base := context.WithoutCancel(ctx)
	return cons.Consume(func(msg jetstream.Msg) {
		ctx, cancel := context.WithTimeout(base, handleTimeout)
		defer cancel()
		if err := n.handle(ctx, msg.Subject(), msg.Headers(), msg.Data()); err != nil {
			n.logger.ErrorContext(ctx, "consumer: handle message; it will be redelivered", "subject", msg.Subject(), "error", err)
			_ = msg.NakWithDelay(time.Second)
			return
		}
		if err := msg.Ack(); err != nil {
			// The effect is committed; the redelivery that follows finds the message processed.
			n.logger.WarnContext(ctx, "consumer: ack", "subject", msg.Subject(), "error", err)
		}
	}, jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		n.logger.Warn("consumer", "error", err)
	}))
}

// handle processes one message in a span of kind CONSUMER, a child of the publish span whose
// context the message's headers carry. It returns nil once the message's effect is committed —
// now, or by an earlier delivery of the same message — and an error when the message should be
// delivered again.
func (n *notifier) handle(ctx context.Context, subject string, h nats.Header, data []byte) error {
	ctx = propagation.TraceContext{}.Extract(ctx, natsHeaders(h))
	msgID := h.Get(jetstream.MsgIDHeader) // the outbox event's id
	ctx, span := n.tracer.Start(ctx, "process "+subject, trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			semconv.MessagingSystemKey.String("nats"),
			semconv.MessagingOperationName("process"),
			semconv.MessagingOperationTypeProcess,
			semconv.MessagingDestinationName(subject),
			semconv.MessagingMessageID(msgID),
		))
	defer span.End()
	done, err := n.process(ctx, subject, msgID, h.Get("outbox-event-type"), data)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		return err
	}
	span.SetAttributes(duplicateKey.Bool(done))
	return nil
}

// duplicateKey marks a consumer span whose message had been processed already.
const duplicateKey = attribute.Key("orders.duplicate")

// process records the message's effect and its id in one transaction, and reports whether an
// earlier delivery had already done so.
func (n *notifier) process(ctx context.Context, subject, msgID, eventType string, data []byte) (duplicate bool, err error) {
	var kind string
	switch eventType {
	case "OrderPlaced":
		kind = "placed"
	case "OrderCancelled":
		kind = "cancelled"
	default:
		return false, nil // Order_create and Order_update: for other consumers, nothing to do here
	}
	if msgID == "" {
		return false, fmt.Errorf("%s message on %s has no %s header", eventType, subject, jetstream.MsgIDHeader)
	}
	var ev orderEvent
	if err := json.Unmarshal(data, &ev); err != nil {
		return false, fmt.Errorf("decode %s %s: %w", eventType, msgID, err)
	}
	err = n.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		// The id first: ON CONFLICT DO NOTHING inserts nothing when an earlier delivery committed
		// it, and waits for a concurrent delivery's transaction to end before deciding, so that of
		// two deliveries at once exactly one goes on to the effect.
		res := tx.Clauses(clause.OnConflict{DoNothing: true}).
			Create(&ProcessedMessage{MessageID: msgID, Subject: subject, ProcessedAt: time.Now()})
		if res.Error != nil {
			return res.Error
		}
		if res.RowsAffected == 0 {
			duplicate = true
			return nil
		}
		return tx.Create(&OrderNotification{
			OrderID: ev.ID,
			Kind:    kind,
			Text:    fmt.Sprintf("order %d for %s (%d) %s", ev.ID, ev.Customer, ev.Amount, kind),
		}).Error
	})
	if err != nil {
		return false, fmt.Errorf("record %s %s: %w", eventType, msgID, err)
	}
	return duplicate, nil
}

// natsHeaders carries a trace context in NATS headers, whose names are case-sensitive:
// propagation.HeaderCarrier would look for "Traceparent" and miss the "traceparent" the publisher
// sends.
type natsHeaders nats.Header

func (h natsHeaders) Get(key string) string { return nats.Header(h).Get(key) }
func (h natsHeaders) Set(key, value string) { nats.Header(h).Set(key, value) }
func (h natsHeaders) Keys() []string        { return slices.Collect(maps.Keys(h)) }
