package outboxplugin_test

import (
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/stretchr/testify/assert"
)

func TestHeaderList(t *testing.T) {
	m := outboxplugin.Message{
		ID: "0190-id", EventType: "User_update", Key: "User:7", AggregateType: "User", AggregateID: "7",
		Headers:   map[string]string{"traceparent": "00-a-b-01", "b": "2", outboxplugin.HeaderID: "spoofed"},
		CreatedAt: time.Date(2026, 12, 1, 10, 0, 0, 5, time.FixedZone("x", 3600)), Attempt: 3,
	}
	assert.Equal(t, []outboxplugin.Header{
		{"b", "2"}, {"traceparent", "00-a-b-01"},
		{outboxplugin.HeaderID, "0190-id"}, {outboxplugin.HeaderEventType, "User_update"},
		{outboxplugin.HeaderKey, "User:7"}, {outboxplugin.HeaderAggregateType, "User"},
		{outboxplugin.HeaderAggregateID, "7"}, {outboxplugin.HeaderCreatedAt, "2026-12-01T09:00:00.000000005Z"},
		{outboxplugin.HeaderAttempt, "3"},
	}, m.HeaderList())

	bare := outboxplugin.Message{ID: "i", EventType: "Ping", CreatedAt: time.Unix(0, 0)}
	assert.Equal(t, []outboxplugin.Header{
		{outboxplugin.HeaderID, "i"}, {outboxplugin.HeaderEventType, "Ping"},
		{outboxplugin.HeaderCreatedAt, "1970-01-01T00:00:00Z"}, {outboxplugin.HeaderAttempt, "0"},
	}, bare.HeaderList())
}

func TestRouteTokens(t *testing.T) {
	for _, c := range []struct{ agg, ev, wantAgg, wantEv string }{
		{"User", "User_create", "User", "User_create"},
		{"", "OrderPlaced", "_", "OrderPlaced"},
		{"billing.Invoice", "a b*>", "billing_Invoice", "a_b__"},
		{"Straße", "x", "Stra__e", "x"},
	} {
		agg, ev := outboxplugin.RouteTokens(outboxplugin.Message{AggregateType: c.agg, EventType: c.ev})
		assert.Equal(t, c.wantAgg, agg, c.agg)
		assert.Equal(t, c.wantEv, ev, c.ev)
	}
}
