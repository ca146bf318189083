// Command outbox looks at and repairs the outbox table of a GORM application that uses
// github.com/gorm-outbox/outboxplugin: counts per state, lists and single events, requeue and discard
// of failed events, cleanup of processed rows, and the table's migration; and relay runs the workers
// that publish the events to NATS JetStream, Kafka, RabbitMQ or Redis Streams; and ui serves the web
// console. Every command and flag:
// https://github.com/gorm-outbox/outboxplugin/blob/main/cmd/outbox/README.md
// Deploying the relay: https://github.com/gorm-outbox/outboxplugin/blob/main/docs/operations.md
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run executes the command line args and returns the process's exit code. Every error is printed to
// stderr with the DSN's credentials redacted.
func run(ctx context.Context, args []string, stdin *os.File, stdout, stderr *os.File) int {
	a := &app{stdin: stdin, stdout: stdout, stderr: stderr}
	root := newRootCmd(a)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	code := a.exitCode(err)
	fmt.Fprintln(stderr, "outbox: "+a.redact(err.Error()))
	if missingTable(err) {
		fmt.Fprintln(stderr, a.missingTableHint())
	}
	if code == exitUsage {
		fmt.Fprintln(stderr, "Run 'outbox --help' (or 'outbox COMMAND --help') for usage.")
	}
	return code
}
