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

// agentCmd runs the agent, or, given hold or unhold and a context, reaches
// the running agent of --client-id through its control socket.
type agentCmd struct {
	Control       []string          `arg:"" optional:"" name:"hold|unhold context" help:"hold <context> or unhold <context>: take control of one of the running agent's flows (applications' mutations on it are refused held) or give it back, through its control socket, instead of running an agent."`
	TTL           int64             `name:"ttl" default:"300" help:"With hold: seconds until the hold ends by itself (1 to 3600)."`
	ControlSocket string            `name:"control-socket" help:"The unix socket (mode 0600) that agent hold and unhold reach; default: $XDG_RUNTIME_DIR/cheetah/agent-<client id>.sock, or <tmp>/cheetah-<uid>/agent-<client id>.sock; off: none."`
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

func (c *agentCmd) Run() error {
	if len(c.Control) > 0 {
		return c.control()
	}
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
		path := c.controlSocket()
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

// controlSocket is where the agent of c.ClientID listens.
func (c *agentCmd) controlSocket() string {
	if c.ControlSocket != "" {
		return c.ControlSocket
	}
	id := c.ClientID
	if id == "" {
		host, _ := os.Hostname()
		id = "console-" + host
	}
	return agent.DefaultControlSocket(id)
}

// control runs `cheetah agent hold <context>` or `unhold <context>`.
func (c *agentCmd) control() error {
	if len(c.Control) != 2 || (c.Control[0] != "hold" && c.Control[0] != "unhold") {
		return usageErr("cheetah agent takes hold <context> or unhold <context>, or no argument to run the agent")
	}
	req := agent.ControlRequest{Op: c.Control[0], ContextID: c.Control[1]}
	if req.Op == "hold" {
		if c.TTL < 1 || c.TTL > protocol.MaxHoldTTL {
			return usageErr("--ttl must be from 1 to 3600")
		}
		req.TTLSeconds = c.TTL
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ans, err := agent.Control(ctx, c.controlSocket(), req)
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
