package egresspolicy

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// Rule is one [agents.egress] allow entry: "[METHOD[,METHOD…] ]host[:port]".
// host is a name, an IP or a glob whose "*." prefix matches one or more
// labels; without a port, 80 and 443 are allowed.
type Rule struct {
	Raw     string   `json:"rule"`
	Host    string   `json:"host"`
	Port    int      `json:"port,omitempty"`
	Methods []string `json:"methods,omitempty"`
	// AgentTool, when set, is berth-agent's own tool the rule is for ("web_search",
	// "MCP server tracker"): it allows berth-agent's own requests only
	// (channel.go), never a tool's.
	AgentTool string `json:"agent_tool,omitempty"`
}

// HTTPMethods are the methods a rule may name.
var HTTPMethods = []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT"}

// ParseRule parses one allow entry; the error says what is wrong.
func ParseRule(s string) (Rule, error) {
	r := Rule{Raw: s}
	fields := strings.Fields(s)
	switch len(fields) {
	case 1:
	case 2:
		for m := range strings.SplitSeq(fields[0], ",") {
			m = strings.ToUpper(m)
			if !slices.Contains(HTTPMethods, m) {
				return Rule{}, fmt.Errorf("%q: %q is not an HTTP method (%s)", s, m, strings.Join(HTTPMethods, ", "))
			}
			r.Methods = append(r.Methods, m)
		}
	default:
		return Rule{}, fmt.Errorf("%q: want \"host\", \"host:port\" or \"METHODS host[:port]\"", s)
	}
	hostport := fields[len(fields)-1]
	if strings.Contains(hostport, "/") {
		return Rule{}, fmt.Errorf("%q: a rule names a host, not a URL", s)
	}
	host := hostport
	if h, p, err := net.SplitHostPort(hostport); err == nil {
		port, err := strconv.Atoi(p)
		if err != nil || port < 1 || port > 65535 {
			return Rule{}, fmt.Errorf("%q: port %q is not 1-65535", s, p)
		}
		host, r.Port = h, port
	}
	host = NormalHost(host)
	if host == "" {
		return Rule{}, fmt.Errorf("%q: no host", s)
	}
	if _, err := netip.ParseAddr(host); err != nil {
		glob := strings.TrimPrefix(host, "*.")
		if host != "*" && (strings.Contains(glob, "*") || !ValidHostname(glob)) {
			return Rule{}, fmt.Errorf("%q: %q is not a host name, an IP address or a \"*.\" glob", s, host)
		}
	}
	r.Host = host
	return r, nil
}

// ParseHost parses an exact host name or IP address (no glob, no port, no
// method), as [[egress.secrets]] hosts are written.
func ParseHost(s string) (string, error) {
	r, err := ParseRule(s)
	if err != nil || r.Port != 0 || len(r.Methods) > 0 || strings.Contains(r.Host, "*") {
		return "", fmt.Errorf("%q is not a host name (exact, no glob, no port)", s)
	}
	return r.Host, nil
}

// NormalHost is host as rules compare it: lower case, without brackets or
// a trailing dot.
func NormalHost(host string) string {
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	return strings.ToLower(strings.TrimSuffix(host, "."))
}

// ValidHostname says whether h is a DNS name of letters, digits, '-' and '_'.
func ValidHostname(h string) bool {
	if h == "" || len(h) > 253 {
		return false
	}
	for label := range strings.SplitSeq(h, ".") {
		if label == "" || len(label) > 63 || strings.HasPrefix(label, "-") || strings.HasSuffix(label, "-") {
			return false
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// Matches says whether the rule allows method to host:port.
func (r Rule) Matches(method, host string, port int) bool {
	if len(r.Methods) > 0 && !slices.Contains(r.Methods, strings.ToUpper(method)) {
		return false
	}
	if r.Port != 0 && r.Port != port || r.Port == 0 && port != 80 && port != 443 {
		return false
	}
	host = NormalHost(host)
	switch {
	case r.Host == "*":
		return true
	case strings.HasPrefix(r.Host, "*."):
		return strings.HasSuffix(host, r.Host[1:]) && len(host) > len(r.Host)-1
	}
	return host == r.Host
}

// Names says whether the rule names host exactly (no glob): only such a rule
// lets the proxy reach an internal destination (see Internal).
func (r Rule) Names(host string) bool {
	return !strings.Contains(r.Host, "*") && r.Host == NormalHost(host)
}

// MatchRule is the rule that lets method reach host:port: one naming the
// host exactly first (it is the only kind that may reach an internal
// address), else the first that matches. The caller judges the address
// with that same rule, so host, port, method and the internal-address
// exception never come from different rules.
func MatchRule(rules []Rule, method, host string, port int) (Rule, bool) {
	first := -1
	for i, r := range rules {
		if !r.Matches(method, host, port) {
			continue
		}
		if r.Names(host) {
			return r, true
		}
		if first < 0 {
			first = i
		}
	}
	if first < 0 {
		return Rule{}, false
	}
	return rules[first], true
}

// NoRule is the reason a request no rule matches is refused.
func NoRule(method, host string, port int) string {
	return fmt.Sprintf("no [agents.egress] allow rule matches %s %s:%d", method, host, port)
}
