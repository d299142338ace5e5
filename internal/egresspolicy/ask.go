package egresspolicy

import (
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// Ask is a request the egress proxy holds until a person decides: an
// [agents.egress] ask rule matched it (issue 26, approvals). The proxy
// reports it on its stdout; the scheduler keeps it pending in scheduler.db,
// asks in the conversation and answers with an Answer on the proxy's stdin.
type Ask struct {
	// ID names the ask within its proxy (and in scheduler.db, with the run).
	ID     string `json:"id"`
	Method string `json:"method"`
	Host   string `json:"host"`
	Port   int    `json:"port"`
	// Path is the request's path where the proxy sees it ("" for a tunnel
	// it does not read).
	Path string `json:"path,omitempty"`
	// Rule is the ask rule that matched, as written in the config.
	Rule string `json:"rule"`
	// Tool and Command are a tool call's, held by an [agents.tools] ask
	// rule (toolask.go); Method, Host and Port are then empty.
	Tool    string `json:"tool,omitempty"`
	Command string `json:"command,omitempty"`
}

// What is the ask as a person reads it: "POST api.stripe.com:443/v1/charges",
// or a tool call's "shell: git push origin main" (ShowCommand: a command
// with control characters reads quoted).
func (a Ask) What() string {
	if a.Tool != "" {
		return a.Tool + ": " + ShowCommand(a.Command)
	}
	s := a.Method + " " + a.Host + ":" + strconv.Itoa(a.Port)
	if a.Path != "" {
		s += a.Path
	}
	return s
}

// Answer decides an Ask.
type Answer struct {
	ID    string `json:"id"`
	Allow bool   `json:"allow"`
	// Standing allows every later request the same ask rule matches for
	// the rest of the proxy's life (a conversation's sandbox: the
	// conversation) without asking again. Only with Allow.
	Standing bool `json:"standing,omitempty"`
	// By is who decided ("berthctl:root", "slack:U012345", "timeout"); the
	// decision's reason names it.
	By string `json:"by"`
}

// The order a tool's request is judged in: an allow rule (or a provider, or
// a git rule's host) allows it at once; else an ask rule holds it for an
// Answer; else it is refused. Allow beats ask, ask beats the default deny.

// askRefusal is what Destination says of a request only an ask rule
// matches: held, not refused, by a proxy that can wait for an Answer.
func askRefusal(rule Rule) *Refusal {
	return &Refusal{Code: http.StatusForbidden, Reason: fmt.Sprintf("asks a person first: [agents.egress] ask rule %q matches it", rule.Raw), Ask: &rule}
}

// Approved is the reason of a request a person allowed.
func Approved(by string) string { return "approved by " + by }

// ApprovedEarlier is the reason of a request a standing Answer allowed.
func ApprovedEarlier(by string) string { return "approved earlier by " + by }

// Denied is the reason of a request a person refused.
func Denied(by string) string { return "denied by " + by }

// NotApprovedWithin is the reason of a request nobody answered in time.
func NotApprovedWithin(d time.Duration) string { return "not approved within " + d.String() }

// ByTimeout is the Answer.By of an ask nobody answered in time.
const ByTimeout = "timeout"

// DefaultApprovalTimeout is how long a held request waits for its Answer
// when the policy names no approval_timeout.
const DefaultApprovalTimeout = 10 * time.Minute
