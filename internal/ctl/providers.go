package ctl

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/berth-dev/berth/agent/provider"
	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/config"
)

const providersUsage = "usage: berthctl providers test [--config FILE] [--timeout D] [NAME]"

// providers runs "providers test": one small call to each configured
// provider (or the named one) from this host, with the key read from
// api_key_env in berthctl's own environment. It exits 1 when any fails.
func (c *cli) providers(args []string) error {
	if len(args) == 0 || args[0] != "test" {
		return usageError(providersUsage)
	}
	fs := newFlags("providers test")
	path := fs.String("config", "", "config file")
	timeout := fs.Duration("timeout", 30*time.Second, "timeout of each provider's call")
	if err := fs.Parse(args[1:]); err != nil || fs.NArg() > 1 {
		return usageError(providersUsage)
	}
	p := *path
	if p == "" {
		p = os.Getenv("BERTH_CONFIG")
	}
	if p == "" {
		p = config.DefaultPath
	}
	cfg, err := config.Load(p)
	if err != nil {
		return &exitErr{ExitFailed, fmt.Sprintf("cannot load %s: %v", p, err)}
	}
	names := make([]string, 0, len(cfg.Providers.Entries))
	for name := range cfg.Providers.Entries {
		names = append(names, name)
	}
	sort.Strings(names)
	if fs.NArg() == 1 {
		if !slices.Contains(names, fs.Arg(0)) {
			return &exitErr{ExitFailed, fmt.Sprintf("provider %q is not defined in %s (defined: %v)", fs.Arg(0), p, names)}
		}
		names = []string{fs.Arg(0)}
	}

	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PROVIDER\tKIND\tMODEL\tRESULT\tLATENCY\tDETAIL")
	failed := 0
	for _, name := range names {
		e := cfg.Providers.Entries[name]
		kind := e.Kind
		if kind == "" {
			kind = name
		}
		ap := agentproto.Provider{Name: name, Kind: kind, BaseURL: e.BaseURL, Model: e.Model, MaxTokens: e.MaxTokens}
		var res provider.ProbeResult
		switch {
		case kind == "local":
			res = provider.ProbeResult{Verdict: "ok", Detail: "offline; nothing to reach"}
		case e.APIKeyEnv != "" && os.Getenv(e.APIKeyEnv) == "":
			res = provider.ProbeResult{Verdict: "no key", Detail: fmt.Sprintf("%s is not set in berthctl's environment", e.APIKeyEnv)}
		default:
			if e.APIKeyEnv != "" {
				ap.Key = os.Getenv(e.APIKeyEnv)
			}
			ctx, cancel := context.WithTimeout(context.Background(), *timeout)
			res = provider.Probe(ctx, ap)
			cancel()
		}
		if res.Verdict != "ok" {
			failed++
		}
		latency := "-"
		if res.Latency > 0 {
			latency = fmt.Sprintf("%.1fms", float64(res.Latency.Microseconds())/1000)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", name, kind, e.Model, res.Verdict, latency, res.Detail)
	}
	tw.Flush()
	if failed > 0 {
		return &exitErr{ExitFailed, fmt.Sprintf("%d of %d providers failed", failed, len(names))}
	}
	return nil
}
