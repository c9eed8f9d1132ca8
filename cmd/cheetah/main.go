// Command cheetah is the broker's one binary: the broker itself (serve), the
// console agent (agent) and schema migrations (migrate).
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"

	"github.com/alecthomas/kong"

	cheetah "github.com/cheetahbroker/cheetah"
)

// cli is the command tree. Every flag of a subcommand can also be set as
// CHEETAH_<NAME>, but for the keys: --key is CHEETAH_CLIENT_KEY for the
// agent and CHEETAH_ADMIN_KEY for the admin commands (as --admin-key is for
// serve), so that neither key is ever taken for the other.
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
	Quotas     quotasCmd     `cmd:"" group:"admin" help:"Quotas: caps, occupancy per level and scope; --reload reads the file again."`

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
// 1 failed, 2 usage, 3 not found, 4 denied, 5 unavailable. An error is one
// line on stderr, or with --json one JSON object on stderr (jsonError).
func run(args []string) int {
	var c cli
	parser, err := kong.New(&c,
		kong.Name("cheetah"),
		kong.Description("Cheetah: a command broker for connected worker contexts."),
		kong.UsageOnError(),
		kong.DefaultEnvars("CHEETAH"),
		defaults,
	)
	if err != nil {
		fmt.Fprintln(os.Stderr, "cheetah:", err)
		return exitError
	}
	ctx, err := parser.Parse(args)
	if err != nil {
		if jsonRequested(args) {
			writeJSONError(os.Stderr, exitUsage, err)
			return exitUsage
		}
		parser.Errorf("%s", err)
		return exitUsage
	}
	asJSON := false
	if sel := ctx.Selected(); sel != nil && sel.Target.CanAddr() {
		if j, ok := sel.Target.Addr().Interface().(interface{ jsonOutput() bool }); ok {
			asJSON = j.jsonOutput()
		}
	}
	if err := ctx.Run(); err != nil {
		code, cause := exitError, err
		var ee *codedError
		if errors.As(err, &ee) {
			code, cause = ee.code, ee.cause
		}
		if cause == nil {
			return code
		}
		if asJSON {
			writeJSONError(os.Stderr, code, cause)
		} else {
			fmt.Fprintln(os.Stderr, "cheetah:", cause)
		}
		return code
	}
	return exitOK
}

// jsonRequested reports whether args ask for --json, for a parse error:
// kong has not set the flag then.
func jsonRequested(args []string) bool {
	for _, a := range args {
		switch a {
		case "--":
			return false
		case "--json", "--json=true", "--json=1":
			return true
		}
	}
	on, _ := strconv.ParseBool(os.Getenv("CHEETAH_JSON"))
	return on
}

// jsonError is how an error is printed with --json: the HTTP API's error
// envelope, {"error":{"code":…,"message":…,"reason":…}}. An error the broker
// answered keeps its code and reason; one found before anything was sent
// has the code of its exit status (codeOfExit).
type jsonError struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
		Reason  string `json:"reason,omitempty"`
	} `json:"error"`
}

// codeOfExit names the exit statuses for errors that carry no API code.
var codeOfExit = map[int]string{
	exitError:       "failed",
	exitUsage:       cheetah.CodeInvalidRequest,
	exitNotFound:    cheetah.CodeNotFound,
	exitDenied:      cheetah.CodeUnauthorized,
	exitUnavailable: "unavailable",
}

func writeJSONError(w io.Writer, exit int, err error) {
	var out jsonError
	code, reason, msg := cheetah.Classify(err)
	if code == "" {
		code, msg = codeOfExit[exit], err.Error()
	}
	out.Error.Code, out.Error.Message, out.Error.Reason = code, msg, reason
	_ = json.NewEncoder(w).Encode(out)
}

// defaults are the flags' defaults, taken from the broker's own so that
// there is one source of truth for each.
var defaults = kong.Vars{
	"default_ttl":                cheetah.DefaultTTL.String(),
	"default_reconnect_grace":    cheetah.DefaultReconnectGrace.String(),
	"default_heartbeat":          cheetah.DefaultHeartbeat.String(),
	"default_max_message_bytes":  strconv.Itoa(cheetah.DefaultMaxMessageBytes),
	"default_max_body_bytes":     strconv.Itoa(cheetah.DefaultMaxBodyBytes),
	"default_max_in_flight":      strconv.Itoa(cheetah.DefaultMaxInFlightPerContext),
	"default_max_pending_hellos": strconv.Itoa(cheetah.DefaultMaxPendingHellos),
}
