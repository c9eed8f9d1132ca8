// Command cheetah is the broker's one binary: the broker itself (serve), the
// console agent (agent) and schema migrations (migrate).
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/alecthomas/kong"
)

// cli is the command tree. Every flag of a subcommand can also be set as
// CHEETAH_<NAME>.
type cli struct {
	Serve   serveCmd   `cmd:"" help:"Run the broker."`
	Agent   agentCmd   `cmd:"" help:"Run a console agent that offers command flows to a broker."`
	Migrate migrateCmd `cmd:"" help:"Apply schema migrations and print the schema version."`

	Pools      poolsCmd      `cmd:"" group:"admin" help:"Per user: clients and contexts by state."`
	Clients    clientsCmd    `cmd:"" group:"admin" help:"Connected and recently connected clients."`
	Leases     leasesCmd     `cmd:"" group:"admin" help:"Active leases (never their tokens)."`
	History    historyCmd    `cmd:"" group:"admin" help:"One command with every message that came back for it."`
	Keys       keysCmd       `cmd:"" group:"admin" help:"Make, list and revoke API keys."`
	Revoke     revokeCmd     `cmd:"" group:"admin" help:"End the lease on a context (reason revoked)."`
	Disconnect disconnectCmd `cmd:"" group:"admin" help:"Close a client's connection (4403)."`

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
	os.Exit(run(os.Args[1:]))
}

// run parses args and runs the command, returning the exit code: 0 done,
// 1 failed, 2 usage, 3 not found, 4 denied, 5 unavailable.
func run(args []string) int {
	var c cli
	parser, err := kong.New(&c,
		kong.Name("cheetah"),
		kong.Description("Cheetah: a command broker for connected worker contexts."),
		kong.UsageOnError(),
		kong.DefaultEnvars("CHEETAH"),
	)
	if err != nil {
		fmt.Fprintln(os.Stderr, "cheetah:", err)
		return exitError
	}
	ctx, err := parser.Parse(args)
	if err != nil {
		parser.Errorf("%s", err)
		return exitUsage
	}
	if err := ctx.Run(); err != nil {
		var ee *codedError
		if errors.As(err, &ee) {
			if ee.cause != nil {
				fmt.Fprintln(os.Stderr, "cheetah:", ee.cause)
			}
			return ee.code
		}
		fmt.Fprintln(os.Stderr, "cheetah:", err)
		return exitError
	}
	return exitOK
}
