package outboxkafka

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/gorm-outbox/outboxplugin"
)

var _ outboxplugin.CheckingPublisher = (*Publisher)(nil)

// WithCheckTopics sets the topics Check looks up: each must exist, and the client be allowed to see
// it. There are none by default (the topic of DefaultTopic and of WithTopic depends on the message);
// give the topic here when it is fixed.
func WithCheckTopics(topics ...string) Option {
	return func(p *Publisher) error {
		for _, t := range topics {
			if t == "" {
				return fmt.Errorf("outboxkafka: %w: empty check topic", outboxplugin.ErrInvalidOption)
			}
		}
		p.checkTopics = append([]string{}, topics...)
		return nil
	}
}

// Check tells whether Kafka takes the publisher's records before it is given any
// (outboxplugin.CheckingPublisher: the worker calls it when Run starts): a broker answers (a SASL
// login it refuses is a configuration error), and each topic of WithCheckTopics exists and may be
// seen — asked for in a metadata request that creates no topic. Errors name the topic and the seed
// brokers, and wrap outboxplugin.ErrMisconfigured or outboxplugin.ErrBrokerUnavailable.
func (p *Publisher) Check(ctx context.Context) error {
	if err := p.client.Ping(ctx); err != nil {
		if misconfigured(err) {
			return fmt.Errorf("outboxkafka: check: %w (brokers %s): %w", outboxplugin.ErrMisconfigured, p.brokers, err)
		}
		return fmt.Errorf("outboxkafka: check: %w (brokers %s): %w", outboxplugin.ErrBrokerUnavailable, p.brokers, err)
	}
	if len(p.checkTopics) == 0 {
		return nil
	}
	req := kmsg.NewPtrMetadataRequest()
	req.AllowAutoTopicCreation = false
	for _, t := range p.checkTopics {
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(t)
		req.Topics = append(req.Topics, rt)
	}
	resp, err := req.RequestWith(ctx, p.client)
	if err != nil {
		if misconfigured(err) {
			return fmt.Errorf("outboxkafka: check: %w (brokers %s): %w", outboxplugin.ErrMisconfigured, p.brokers, err)
		}
		return fmt.Errorf("outboxkafka: check: topic metadata: %w (brokers %s): %w", outboxplugin.ErrBrokerUnavailable, p.brokers, err)
	}
	for _, t := range resp.Topics {
		err := kerr.ErrorForCode(t.ErrorCode)
		if err == nil {
			continue
		}
		name := ""
		if t.Topic != nil {
			name = *t.Topic
		}
		if misconfigured(err) {
			return fmt.Errorf("outboxkafka: check: topic %q: %w (brokers %s): %w", name, outboxplugin.ErrMisconfigured, p.brokers, err)
		}
		return fmt.Errorf("outboxkafka: check: topic %q: %w (brokers %s): %w", name, outboxplugin.ErrBrokerUnavailable, p.brokers, err)
	}
	return nil
}
