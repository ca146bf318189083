package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"
)

func init() { register(newCleanupCmd) }

func newCleanupCmd(a *app) *cobra.Command {
	var olderThan string
	cmd := &cobra.Command{
		Use:   "cleanup",
		Short: "Delete processed events older than an age",
		Long: `cleanup deletes the processed events created more than --older-than ago, 1000 rows per
statement. Pending and dead events are never touched. It may run beside workers and their own
periodic cleanup.`,
		Example: `  outbox cleanup --db shop.db --older-than 7d
  outbox cleanup --db shop.db --older-than 36h --json`,
		Args: noArgs,
		RunE: a.runE(func(cmd *cobra.Command, _ []string) error {
			if olderThan == "" {
				return usagef("--older-than is required (7d, 36h, ...)")
			}
			age, err := parseAge(olderThan)
			if err != nil {
				return usagef("--older-than: %w", err)
			}
			adm, closeDB, err := a.admin(cmd.Context())
			if err != nil {
				return err
			}
			defer closeDB()
			n, err := adm.Cleanup(cmd.Context(), age)
			if err != nil {
				return err
			}
			if a.json {
				return a.printJSON(struct {
					Deleted          int64   `json:"deleted"`
					OlderThanSeconds float64 `json:"older_than_seconds"`
				}{n, age.Seconds()})
			}
			_, err = fmt.Fprintf(a.stdout, "deleted %d processed events older than %s\n", n, age.Round(time.Second))
			return err
		}),
	}
	cmd.Flags().StringVar(&olderThan, "older-than", "", "delete processed events created more than this long ago: a Go duration (36h) or days (7d); required")
	return cmd
}
