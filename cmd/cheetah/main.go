// Command cheetah is the broker's one binary: the broker itself (serve), the
// console agent (agent) and schema migrations (migrate).
package main

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/alecthomas/kong"
)

// cli is the command tree. Every flag of a subcommand can also be set as
// CHEETAH_<NAME>.
type cli struct {
	Serve   serveCmd   `cmd:"" help:"Run the broker."`
	Agent   agentCmd   `cmd:"" help:"Run a console agent that offers command flows to a broker."`
	Migrate migrateCmd `cmd:"" help:"Apply schema migrations and print the schema version."`
	Version versionCmd `cmd:"" help:"Print the version."`
}

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

type versionCmd struct{}

func (versionCmd) Run() error {
	fmt.Println(version)
	return nil
}

func main() {
	var c cli
	ctx := kong.Parse(&c,
		kong.Name("cheetah"),
		kong.Description("Cheetah: a command broker for connected worker contexts."),
		kong.UsageOnError(),
		kong.DefaultEnvars("CHEETAH"),
	)
	if err := ctx.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "cheetah:", err)
		os.Exit(1)
	}
}

func newLogger(level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l})), nil
}
