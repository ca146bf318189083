package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

func init() { register(newVersionCmd) }

// coreModule is the module path of the outboxplugin core, whose version the binary reports too.
const coreModule = "github.com/gorm-outbox/outboxplugin"

func newVersionCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:     "version",
		Short:   "Print the version of outbox and of the Go toolchain that built it",
		Long:    `version prints the module version the binary was built from ("(devel)" for a build of a work tree), the version of the outboxplugin module it uses, and the Go version.`,
		Example: `  outbox version --json`,
		Args:    noArgs,
		RunE: a.runE(func(*cobra.Command, []string) error {
			v := struct {
				Version      string `json:"version"`
				Outboxplugin string `json:"outboxplugin"`
				Go           string `json:"go"`
			}{"(devel)", "(devel)", runtime.Version()}
			if bi, ok := debug.ReadBuildInfo(); ok {
				if bi.Main.Version != "" {
					v.Version = bi.Main.Version
				}
				for _, d := range bi.Deps {
					if d.Path == coreModule && d.Version != "" {
						v.Outboxplugin = d.Version
					}
				}
			}
			if a.json {
				return a.printJSON(v)
			}
			_, err := fmt.Fprintf(a.stdout, "outbox %s\noutboxplugin %s\n%s\n", v.Version, v.Outboxplugin, v.Go)
			return err
		}),
	}
}
