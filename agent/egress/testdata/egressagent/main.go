// Command egressagent stands in for berth-agent in the egress tests: it
// serves the run's egress on loopback, confines itself with Landlock like
// berth-agent, calls its provider through the proxy and tries a direct
// connection, and reports what happened (and what it was given) as its reply.
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/berth-dev/berth/agent/confine"
	agentegress "github.com/berth-dev/berth/agent/egress"
	"github.com/berth-dev/berth/internal/agentproto"
)

// Report is the reply.
type Report struct {
	Stdin          string   `json:"stdin"`
	Env            []string `json:"env"`
	ProviderStatus int      `json:"provider_status"`
	ProviderBody   string   `json:"provider_body"`
	DirectErr      string   `json:"direct_err"`
	ProxyErr       string   `json:"proxy_err,omitempty"`
	Curl           []string `json:"curl,omitempty"`
	UDPErr         string   `json:"udp_err,omitempty"`
	DNSErr         string   `json:"dns_err,omitempty"`
}

func main() {
	raw, _ := io.ReadAll(os.Stdin)
	var req agentproto.Request
	if err := json.Unmarshal(raw, &req); err != nil {
		fmt.Fprintln(os.Stderr, "bad request:", err)
		os.Exit(agentproto.ExitBadRequest)
	}
	rep := Report{Stdin: string(raw), Env: os.Environ()}
	if req.Egress != nil {
		p, err := agentegress.Listen(*req.Egress)
		if err != nil {
			rep.ProxyErr = err.Error()
		} else {
			go p.Serve()
		}
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if !req.Policy.Unrestricted {
		abi, err := confine.EffectiveABI()
		if err == nil {
			_, err = confine.Enforce(req.Policy, abi, log)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "confinement failed:", err)
			os.Exit(agentproto.ExitConfinement)
		}
	}
	client := &http.Client{Timeout: 10 * time.Second}
	body, _ := json.Marshal(map[string]any{"model": req.Provider.Model, "messages": []any{}})
	resp, err := client.Post(req.Provider.BaseURL+"/chat/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		rep.ProviderBody = err.Error()
	} else {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		rep.ProviderStatus, rep.ProviderBody = resp.StatusCode, string(b)
	}
	for line := range strings.SplitSeq(req.Message.Text, "\n") {
		if addr, ok := strings.CutPrefix(line, "direct "); ok {
			c, err := net.DialTimeout("tcp", addr, 2*time.Second)
			if err == nil {
				c.Close()
				rep.DirectErr = ""
			} else {
				rep.DirectErr = err.Error()
			}
		}
		if addr, ok := strings.CutPrefix(line, "udp "); ok {
			rep.UDPErr = "sent"
			c, err := net.Dial("udp", addr)
			if err == nil {
				_, err = c.Write([]byte("x"))
				c.Close()
			}
			if err != nil {
				rep.UDPErr = err.Error()
			}
		}
		if name, ok := strings.CutPrefix(line, "dns "); ok {
			rep.DNSErr = "resolved"
			if _, err := net.LookupHost(name); err != nil {
				rep.DNSErr = err.Error()
			}
		}
		verb, u, _ := strings.Cut(line, " ")
		if (verb == "curl" || verb == "curl-verified") && req.Egress != nil {
			// A tool as the agent starts it: the proxy environment, no token.
			// "curl" skips certificate checks (test upstreams have their
			// own); "curl-verified" trusts only the environment's bundle.
			args := []string{"-s", "--noproxy", "", "-w", " [%{http_code}]", "--max-time", "10", u}
			if verb == "curl" {
				args = append([]string{"-k"}, args...)
			}
			cmd := exec.Command("curl", args...)
			cmd.Env = append(agentegress.EnvFor(*req.Egress), "PATH=/usr/bin:/bin")
			out, err := cmd.CombinedOutput()
			if err != nil {
				out = append(out, []byte(" error: "+err.Error())...)
			}
			rep.Curl = append(rep.Curl, string(out))
		}
	}
	out, _ := json.Marshal(rep)
	json.NewEncoder(os.Stdout).Encode(agentproto.Response{Version: agentproto.Version, RunID: req.RunID, Reply: string(out)})
}
