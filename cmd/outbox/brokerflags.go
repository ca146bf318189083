package main

import (
	"os"
	"slices"
	"strings"

	"github.com/spf13/pflag"
)

// brokerOnlyFlags are the relay's flags that only some brokers read, by the schemes brokerScheme
// returns (kafkas:// is schemeKafka).
var brokerOnlyFlags = []struct {
	flag    string
	schemes []string
	owners  string // for the error
}{
	{"subject-prefix", []string{schemeNATS}, "NATS"},
	{"stream", []string{schemeNATS, schemeRedis}, "NATS and Redis"},
	{"topic", []string{schemeKafka}, "Kafka"},
	{"kafka-ca-file", []string{schemeKafka}, "Kafka"},
	{"exchange", []string{schemeAMQP, schemeAMQPS}, "RabbitMQ"},
}

// checkBrokerFlags refuses, as a usage error, a flag of another broker than the one of --broker (or
// --broker-file), given on the command line or by its OUTBOX_ variable: the relay would ignore it,
// and the operator who set --topic with a NATS broker meant something the relay does not do. A broker
// URL it cannot read is left to the relay, whose error says what is wrong with it.
func checkBrokerFlags(fs *pflag.FlagSet, f *relayFlags) error {
	raw := f.broker
	if raw == "" && f.brokerFile != "" {
		b, err := os.ReadFile(f.brokerFile)
		if err != nil {
			return nil
		}
		raw = strings.TrimSpace(string(b))
	}
	scheme, err := brokerScheme(raw)
	if err != nil {
		return nil
	}
	for _, b := range brokerOnlyFlags {
		if !fs.Changed(b.flag) || slices.Contains(b.schemes, scheme) {
			continue
		}
		return usagef("--%s (or %s) is a flag of %s, and the broker is %s://: the relay would ignore it; remove it",
			b.flag, envName(b.flag), b.owners, scheme)
	}
	return nil
}
