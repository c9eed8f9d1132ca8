package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/cheetahbroker/cheetah/agent"
	"github.com/cheetahbroker/cheetah/protocol"
	"github.com/cheetahbroker/cheetah/server/telemetry"
)

// clientKeyEnv names the agent's client key. It is not the admin commands'
// variable (adminKeyEnv): an admin key exported for them is no client key.
const clientKeyEnv = "CHEETAH_CLIENT_KEY"

// agentCmd runs the agent (the default) or reaches a running one through
// its control socket (hold, unhold).
type agentCmd struct {
	Run    agentRunCmd    `cmd:"" default:"withargs" help:"Run a console agent (the default: cheetah agent [flags])."`
	Hold   agentHoldCmd   `cmd:"" help:"Take control of one of a running agent's flows: applications' mutations on it are refused held until unhold or the TTL."`
	Unhold agentUnholdCmd `cmd:"" help:"Give a held flow back to applications."`
}

type agentRunCmd struct {
	ControlSocket string            `name:"control-socket" help:"The unix socket (mode 0600) that cheetah agent hold and unhold reach; default: $XDG_RUNTIME_DIR/cheetah/agent-<client id>.sock, or <tmp>/cheetah-<uid>/agent-<client id>.sock; off: none."`
	URL           string            `default:"http://127.0.0.1:8420" help:"The broker's address: http(s)://host:port, or ws(s)://…; https and wss use TLS."`
	CAFile        string            `name:"ca-file" type:"existingfile" help:"PEM file of CA certificates to trust for an https or wss broker, besides the system's (a private CA or a self-signed certificate)."`
	Key           string            `env:"CHEETAH_CLIENT_KEY" help:"A client key; removed from the environment before any program runs."`
	ClientID      string            `name:"client-id" help:"This agent's client id, stable across restarts; default: console-<hostname>."`
	Name          string            `help:"A name shown to operators; default: the hostname."`
	Flows         int               `default:"1" help:"How many console flows (contexts) to offer."`
	MaxFlows      int               `name:"max-flows" default:"0" help:"How many flows the agent may hold in all: it opens more, up to this, when the broker asks (acquire with create); 0 is --flows."`
	Allow         []string          `help:"Programs that exec may run, by name or absolute path; repeat the flag or separate with commas. Empty: exec is refused."`
	Labels        map[string]string `help:"Labels for placement, as key=value;…"`
	LogLevel      string            `default:"info" enum:"debug,info,warn,error" help:"debug, info, warn or error."`
	LogFormat     string            `default:"text" enum:"text,json" help:"text (logfmt) or json (one object per line), on stderr."`
}

func (c *agentRunCmd) Run() error {
	log, err := newLog(c.LogLevel, c.LogFormat, c.Key)
	if err != nil {
		return err
	}
	if err := checkURL(c.URL, "http", "https", "ws", "wss"); err != nil {
		return err
	}
	if c.MaxFlows != 0 && (c.MaxFlows < c.Flows || c.MaxFlows > 256) {
		return usageErr("--max-flows must be from --flows to 256")
	}
	if c.Flows < 1 || c.Flows > 256 {
		return usageErr("--flows must be from 1 to 256")
	}
	if c.Key == "" {
		return exitErr(exitDenied, fmt.Errorf("a client key is required: --key or %s%s", clientKeyEnv, oldKeyHint()))
	}
	// Programs that exec runs inherit the agent's environment: no key may
	// be there for an allowed program to print back.
	for _, v := range []string{clientKeyEnv, adminKeyEnv, "CHEETAH_KEY"} {
		os.Unsetenv(v)
	}
	host, _ := os.Hostname()
	if c.ClientID == "" {
		c.ClientID = "console-" + host
	}
	if c.Name == "" {
		c.Name = host
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// Each command's span continues the broker's trace when the OTEL_*
	// variables name a trace exporter (docs/operations.md).
	tel, err := telemetry.New(ctx, telemetry.Config{ServiceName: "cheetah-agent", ServiceVersion: version, FromEnv: true, WithoutMetrics: true})
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := tel.Shutdown(sctx); err != nil {
			log.Warn("flush telemetry", "err", err)
		}
	}()
	tc, err := caConfig(c.CAFile)
	if err != nil {
		return err
	}
	a := agent.New(agent.Config{
		URL: c.URL, TLSConfig: tc, Token: c.Key, ClientID: c.ClientID, Name: c.Name, Version: version,
		Labels: c.Labels, Flows: c.Flows, MaxFlows: c.MaxFlows, Log: log, TracerProvider: tel.TracerProvider(),
		Effects: map[string]string{"echo": agent.EchoEffect, "exec": agent.ExecEffect},
	})
	a.Handle("echo", agent.Echo())
	a.Handle("exec", agent.Exec(c.Allow))
	log.Info("agent starting", "url", c.URL, "client_id", c.ClientID, "flows", c.Flows, "allow", c.Allow)
	if c.ControlSocket != "off" {
		path := c.ControlSocket
		if path == "" {
			path = agent.DefaultControlSocket(c.ClientID)
		}
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			if err := a.ServeControl(cctx, path); err != nil {
				log.Warn("agent: no control socket: cheetah agent hold cannot reach this agent", "err", err)
			}
		}()
		defer func() { cancel(); <-done }()
		log.Info("agent control socket", "path", path)
	}
	return a.Run(ctx)
}

// agentControl is what hold and unhold share: which agent to reach.
type agentControl struct {
	ClientID      string `name:"client-id" help:"The running agent's client id; default: console-<hostname>."`
	ControlSocket string `name:"control-socket" help:"The agent's control socket; default: the one the agent with --client-id uses."`
}

func (c *agentControl) call(req agent.ControlRequest) error {
	path := c.ControlSocket
	if path == "" {
		id := c.ClientID
		if id == "" {
			host, _ := os.Hostname()
			id = "console-" + host
		}
		path = agent.DefaultControlSocket(id)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ans, err := agent.Control(ctx, path, req)
	if err != nil {
		return exitErr(exitUnavailable, err)
	}
	if ans.Error != "" {
		return fmt.Errorf("%s %s: %s", req.Op, req.ContextID, ans.Error)
	}
	fmt.Printf("%s %s\n", req.ContextID, ans.State)
	if ans.State == string(protocol.HoldEnded) && req.Op == "hold" {
		return fmt.Errorf("hold %s: the broker knows no such context of this agent", req.ContextID)
	}
	return nil
}

type agentHoldCmd struct {
	agentControl
	Context string `arg:"" help:"The flow to take control of, such as flow-1."`
	TTL     int64  `name:"ttl" default:"300" help:"Seconds until the hold ends by itself (1 to 3600)."`
}

func (c *agentHoldCmd) Run() error {
	if c.TTL < 1 || c.TTL > protocol.MaxHoldTTL {
		return usageErr("--ttl must be from 1 to 3600")
	}
	return c.call(agent.ControlRequest{Op: "hold", ContextID: c.Context, TTLSeconds: c.TTL})
}

type agentUnholdCmd struct {
	agentControl
	Context string `arg:"" help:"The held flow to give back."`
}

func (c *agentUnholdCmd) Run() error {
	return c.call(agent.ControlRequest{Op: "unhold", ContextID: c.Context})
}

// caConfig returns a TLS configuration that trusts the system's roots and
// the certificates in file, or nil when file is empty.
func caConfig(file string) (*tls.Config, error) {
	if file == "" {
		return nil, nil
	}
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("--ca-file: %w", err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--ca-file: %s holds no PEM certificate", file)
	}
	return &tls.Config{RootCAs: pool}, nil
}
