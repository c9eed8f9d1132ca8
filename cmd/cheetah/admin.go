package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"os"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/context/registry"
	"github.com/cheetahbroker/cheetah/protocol"
	"github.com/cheetahbroker/cheetah/remote"
	"github.com/cheetahbroker/cheetah/server/auth"
)

// Exit codes of the admin commands, so scripts can tell outcomes apart.
const (
	exitOK          = 0
	exitError       = 1 // anything else
	exitUsage       = 2 // bad flags or arguments
	exitNotFound    = 3 // no such thing, or nothing to revoke or disconnect
	exitDenied      = 4 // the key is missing, wrong or not an admin key
	exitUnavailable = 5 // the broker or its store does not answer
)

// adminKeyEnv names the admin commands' key: the variable `serve` reads its
// admin key from, so one export serves both. The agent's client key has a
// variable of its own (clientKeyEnv), so an exported admin key never
// reaches an agent.
const adminKeyEnv = "CHEETAH_ADMIN_KEY"

// adminFlags are shared by every admin command. Kong adds each flag's
// variable to its help.
type adminFlags struct {
	URL  string `default:"http://127.0.0.1:8420" help:"The broker's address, http:// or https://."`
	Key  string `env:"CHEETAH_ADMIN_KEY" help:"An admin key."`
	JSON bool   `name:"json" help:"Print JSON instead of a table; an error is then one JSON object on stderr."`
}

// jsonOutput reports whether errors are to be printed as JSON.
func (f *adminFlags) jsonOutput() bool { return f.JSON }

func (f *adminFlags) client() (*remote.Client, error) {
	if err := checkURL(f.URL, "http", "https"); err != nil {
		return nil, err
	}
	if f.Key == "" {
		return nil, exitErr(exitDenied, fmt.Errorf("an admin key is required: --key or %s%s", adminKeyEnv, oldKeyHint()))
	}
	return remote.NewClient(f.URL, f.Key), nil
}

// oldKeyHint explains a missing key when CHEETAH_KEY, which no command reads,
// is set.
func oldKeyHint() string {
	if os.Getenv("CHEETAH_KEY") != "" {
		return " (CHEETAH_KEY is not read: the admin commands read " + adminKeyEnv + ", the agent " + clientKeyEnv + ")"
	}
	return ""
}

// usageErr is a usage error: exit 2, before anything is sent.
func usageErr(format string, args ...any) error {
	return exitErr(exitUsage, fmt.Errorf(format, args...))
}

// checkURL refuses a broker address that is not an absolute URL with one of
// schemes and a host. The address is not repeated: it is operator input
// that may be anything, a key pasted in the wrong place included.
func checkURL(raw string, schemes ...string) error {
	u, err := url.Parse(raw)
	if err != nil || !slices.Contains(schemes, u.Scheme) || u.Host == "" {
		return usageErr("--url must be an absolute %s:// address with a host, such as http://127.0.0.1:8420", strings.Join(schemes, ":// or "))
	}
	return nil
}

// checkIDs refuses ids (pairs of a name and a value) that are not of the
// broker's id form, which no user, client, context, key or command id
// breaks. An empty value is refused too; optional filters are checked only
// when set. Values are not repeated, for the reason checkURL gives.
func checkIDs(pairs ...string) error {
	for i := 0; i+1 < len(pairs); i += 2 {
		if !protocol.ValidID(pairs[i+1]) {
			return usageErr("the %s is not a valid id: 1 to 128 letters, digits and _ . : - (not first)", pairs[i])
		}
	}
	return nil
}

// call runs one API request with a bounded time.
func (f *adminFlags) call(method, path string, body, out any) error {
	c, err := f.client()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return classify(c.Do(ctx, method, path, body, out))
}

// print writes v as JSON with --json, else calls table.
func (f *adminFlags) print(v any, table func(w io.Writer)) error {
	if f.JSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	table(w)
	return w.Flush()
}

type poolsCmd struct {
	adminFlags
}

func (c *poolsCmd) Run() error {
	var out struct {
		Pools []registry.PoolView `json:"pools"`
	}
	if err := c.call("GET", "/api/v1/admin/pools", nil, &out); err != nil {
		return err
	}
	return c.print(out, func(w io.Writer) {
		fmt.Fprintln(w, "USER\tCLIENTS\tIDLE\tLEASED\tNOT_LIVE\tHUMAN\tWAITERS")
		for _, p := range out.Pools {
			fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%d\t%d\t%d\n", p.UserID, p.Clients, p.Contexts["idle"], p.Contexts["leased"],
				p.Contexts["not_live"], p.Contexts["human"], p.Waiters)
		}
	})
}

type clientsCmd struct {
	adminFlags
	User string `help:"Only this user's clients."`
}

func (c *clientsCmd) Run() error {
	if c.User != "" {
		if err := checkIDs("user", c.User); err != nil {
			return err
		}
	}
	var out struct {
		Clients []registry.ClientView `json:"clients"`
	}
	if err := c.call("GET", "/api/v1/admin/clients?user_id="+url.QueryEscape(c.User), nil, &out); err != nil {
		return err
	}
	return c.print(out, func(w io.Writer) {
		fmt.Fprintln(w, "USER\tCLIENT\tTYPE\tCONNECTED\tCONTEXTS\tNAME\tVERSION")
		for _, v := range out.Clients {
			fmt.Fprintf(w, "%s\t%s\t%s\t%v\t%d\t%s\t%s\n", v.UserID, v.ClientID, v.ClientType, v.Connected, v.Contexts, v.Name, v.Version)
		}
	})
}

type leasesCmd struct {
	adminFlags
	User string `help:"Only this user's leases."`
	Task string `help:"Only this task's leases."`
}

func (c *leasesCmd) Run() error {
	if c.User != "" {
		if err := checkIDs("user", c.User); err != nil {
			return err
		}
	}
	var out struct {
		Leases []cheetah.Lease `json:"leases"`
	}
	q := url.Values{"user_id": {c.User}, "task_id": {c.Task}}
	if err := c.call("GET", "/api/v1/admin/leases?"+q.Encode(), nil, &out); err != nil {
		return err
	}
	return c.print(out, func(w io.Writer) {
		fmt.Fprintln(w, "USER\tCLIENT\tCONTEXT\tTASK\tEPOCH\tEXPIRES")
		for _, l := range out.Leases {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s\n", l.UserID, l.ClientID, l.ContextID, l.TaskID, l.Epoch, l.ExpiresAt.Format(time.RFC3339))
		}
	})
}

type historyCmd struct {
	adminFlags
	CommandID string `arg:"" name:"command_id" help:"The command to show."`
	User      string `required:"" help:"The command's user."`
}

func (c *historyCmd) Run() error {
	if err := checkIDs("command id", c.CommandID, "user", c.User); err != nil {
		return err
	}
	var out struct {
		Command cheetah.CommandRecord `json:"command"`
	}
	path := "/api/v1/users/" + url.PathEscape(c.User) + "/commands/" + url.PathEscape(c.CommandID)
	if err := c.call("GET", path, nil, &out); err != nil {
		return err
	}
	r := out.Command
	return c.print(out, func(w io.Writer) {
		fmt.Fprintf(w, "command\t%s\nname\t%s\nstatus\t%s\ncontext\t%s/%s/%s\ntask\t%s (epoch %d)\ntrace\t%s\ncreated\t%s\n",
			r.CommandID, r.Name, r.Status, r.UserID, r.ClientID, r.ContextID, r.TaskID, r.Epoch, r.TraceID, r.CreatedAt.Format(time.RFC3339Nano))
		if r.Error != nil {
			fmt.Fprintf(w, "error\t%s: %s\n", r.Error.Code, r.Error.Message)
		}
		fmt.Fprintln(w, "\nSEQ\tKIND\tAT\tLATE\tDATA")
		for _, m := range r.Messages {
			data := string(m.Data)
			if m.Kind == cheetah.KindCapture {
				data = fmt.Sprintf("(%s, %d base64 chars)", m.Mime, len(m.Data))
			}
			if m.Code != "" {
				data = m.Code + ": " + m.Message + " " + data
			}
			if len(data) > 120 {
				data = data[:117] + "..."
			}
			fmt.Fprintf(w, "%d\t%s\t%s\t%v\t%s\n", m.Seq, m.Kind, m.At.Format("15:04:05.000"), m.Late, strings.TrimSpace(data))
		}
	})
}

type keysCmd struct {
	Create keysCreateCmd `cmd:"" help:"Make a key; its secret is shown this once."`
	List   keysListCmd   `cmd:"" help:"List keys (never their secrets)."`
	Revoke keysRevokeCmd `cmd:"" help:"Revoke a key; its clients are disconnected."`
}

type keysCreateCmd struct {
	adminFlags
	Kind   string `required:"" enum:"client,app,admin" help:"client, app or admin."`
	User   string `help:"The user a client key is bound to."`
	Tenant string `help:"The tenant an app key is bound to: it acts for that tenant alone (quotas)."`
	Name   string `help:"A name for operators."`
}

func (c *keysCreateCmd) Run() error {
	if c.User != "" {
		if err := checkIDs("user", c.User); err != nil {
			return err
		}
	}
	var out auth.Created
	if c.Tenant != "" {
		if err := checkIDs("tenant", c.Tenant); err != nil {
			return err
		}
	}
	body := cheetah.CreateKeyBody{Kind: c.Kind, UserID: c.User, Name: c.Name, TenantID: c.Tenant}
	if err := c.call("POST", "/api/v1/admin/keys", body, &out); err != nil {
		return err
	}
	return c.print(out, func(w io.Writer) {
		fmt.Fprintf(w, "id\t%s\nkind\t%s\nkey\t%s\n", out.ID, out.Kind, out.Secret)
		if out.WebhookSecret != "" {
			fmt.Fprintf(w, "webhook_secret\t%s\n", out.WebhookSecret)
		}
		fmt.Fprintln(w, "\nThe key is shown only this once.")
	})
}

type keysListCmd struct {
	adminFlags
}

func (c *keysListCmd) Run() error {
	var out struct {
		Keys []auth.Key `json:"keys"`
	}
	if err := c.call("GET", "/api/v1/admin/keys", nil, &out); err != nil {
		return err
	}
	sort.Slice(out.Keys, func(i, j int) bool { return out.Keys[i].CreatedAt.Before(out.Keys[j].CreatedAt) })
	return c.print(out, func(w io.Writer) {
		fmt.Fprintln(w, "ID\tKIND\tUSER\tNAME\tCREATED\tREVOKED")
		for _, k := range out.Keys {
			revoked := "-"
			if k.RevokedAt != nil {
				revoked = k.RevokedAt.Format(time.RFC3339)
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", k.ID, k.Kind, k.UserID, k.Name, k.CreatedAt.Format(time.RFC3339), revoked)
		}
	})
}

type keysRevokeCmd struct {
	adminFlags
	ID string `arg:"" help:"The key's id."`
}

func (c *keysRevokeCmd) Run() error {
	if err := checkIDs("key id", c.ID); err != nil {
		return err
	}
	var out map[string]any
	if err := c.call("DELETE", "/api/v1/admin/keys/"+url.PathEscape(c.ID), nil, &out); err != nil {
		return err
	}
	return c.print(out, func(w io.Writer) { fmt.Fprintf(w, "revoked %s\n", c.ID) })
}

type revokeCmd struct {
	adminFlags
	User    string `arg:"" help:"The user."`
	Client  string `arg:"" help:"The client id."`
	Context string `arg:"" help:"The context id."`
}

func (c *revokeCmd) Run() error {
	if err := checkIDs("user", c.User, "client id", c.Client, "context id", c.Context); err != nil {
		return err
	}
	var out struct {
		Revoked bool `json:"revoked"`
	}
	path := fmt.Sprintf("/api/v1/admin/users/%s/clients/%s/contexts/%s/revoke", url.PathEscape(c.User), url.PathEscape(c.Client), url.PathEscape(c.Context))
	if err := c.call("POST", path, nil, &out); err != nil {
		return err
	}
	if err := c.print(out, func(w io.Writer) { fmt.Fprintf(w, "revoked\t%v\n", out.Revoked) }); err != nil {
		return err
	}
	if !out.Revoked {
		return exitErr(exitNotFound, nil)
	}
	return nil
}

type disconnectCmd struct {
	adminFlags
	User   string `arg:"" help:"The user."`
	Client string `arg:"" help:"The client id."`
}

func (c *disconnectCmd) Run() error {
	if err := checkIDs("user", c.User, "client id", c.Client); err != nil {
		return err
	}
	var out struct {
		Disconnected bool `json:"disconnected"`
	}
	path := fmt.Sprintf("/api/v1/admin/users/%s/clients/%s", url.PathEscape(c.User), url.PathEscape(c.Client))
	if err := c.call("DELETE", path, nil, &out); err != nil {
		return err
	}
	if err := c.print(out, func(w io.Writer) { fmt.Fprintf(w, "disconnected\t%v\n", out.Disconnected) }); err != nil {
		return err
	}
	if !out.Disconnected {
		return exitErr(exitNotFound, nil)
	}
	return nil
}

// codedError carries the process's exit code; a nil cause prints nothing.
type codedError struct {
	code  int
	cause error
}

func (e *codedError) Error() string {
	if e.cause == nil {
		return ""
	}
	return e.cause.Error()
}

func (e *codedError) Unwrap() error { return e.cause }

func exitErr(code int, cause error) error { return &codedError{code: code, cause: cause} }

// classify maps an API error to an exit code.
func classify(err error) error {
	if err == nil {
		return nil
	}
	code, _, _ := cheetah.Classify(err)
	switch code {
	case cheetah.CodeNotFound:
		return exitErr(exitNotFound, err)
	case cheetah.CodeUnauthorized, cheetah.CodeForbidden:
		return exitErr(exitDenied, err)
	case cheetah.CodeStoreUnavailable, cheetah.CodeOverloaded, cheetah.CodeQuotaUnavailable, "":
		return exitErr(exitUnavailable, err)
	case cheetah.CodeInvalidRequest:
		return exitErr(exitUsage, err)
	}
	return exitErr(exitError, err)
}

type quotasCmd struct {
	adminFlags
	Reload bool `help:"Read the broker's quota file again first (as SIGHUP does)."`
}

func (c *quotasCmd) Run() error {
	if c.Reload {
		if err := c.call("POST", "/api/v1/admin/quotas/reload", nil, nil); err != nil {
			return err
		}
	}
	var out registry.QuotasView
	if err := c.call("GET", "/api/v1/admin/quotas", nil, &out); err != nil {
		return err
	}
	return c.print(out, func(w io.Writer) {
		if out.Broken != "" {
			fmt.Fprintf(w, "BROKEN: %s\nAcquires these quotas govern fail quota_unavailable until a good file is loaded.\n\n", out.Broken)
		}
		fmt.Fprintln(w, "QUOTA\tLEVEL\tSCOPE\tUSED\tCAP")
		for _, q := range out.Quotas {
			capOf := func(n int) string {
				if n == 0 {
					return "-"
				}
				return fmt.Sprint(n)
			}
			fmt.Fprintf(w, "%s\tglobal\t\t%d\t%s\n", q.Name, q.Occupancy.Global.Used, capOf(q.Occupancy.Global.Cap))
			for _, u := range q.Occupancy.Tenants {
				fmt.Fprintf(w, "%s\ttenant\t%s\t%d\t%s\n", q.Name, u.TenantID, u.Used, capOf(u.Cap))
			}
			for _, u := range q.Occupancy.Users {
				fmt.Fprintf(w, "%s\tuser\t%s/%s\t%d\t%s\n", q.Name, u.TenantID, u.UserID, u.Used, capOf(u.Cap))
			}
		}
	})
}
