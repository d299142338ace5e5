package egresspolicy

import "strconv"

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
}

// What is the ask as a person reads it: "POST api.stripe.com:443/v1/charges".
func (a Ask) What() string {
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
