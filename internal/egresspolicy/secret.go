package egresspolicy

import (
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// Secret is an [[egress.secrets]] entry that applies to a run: the proxy
// intercepts TLS to its hosts (on its ports) and sets Header to Format
// with "{}" replaced by Value on requests within its scope. Value is
// never marshalled: plans and run records carry the rest only.
type Secret struct {
	Name   string   `json:"name"`
	Hosts  []string `json:"hosts"`
	Header string   `json:"header"`
	Format string   `json:"format"`
	// Ports are the CONNECT ports the secret is for (any, when empty): a
	// tunnel to another port is not intercepted.
	Ports []int `json:"ports,omitempty"`
	// Methods and Paths narrow the requests inside the tunnel that get the
	// secret (any, when empty). A path is a prefix that ends at a segment
	// boundary: "/repos/acme" covers /repos/acme and /repos/acme/x, not
	// /repos/acmex. A request outside the scope is sent without the secret.
	Methods []string `json:"methods,omitempty"`
	Paths   []string `json:"paths,omitempty"`
	Value   string   `json:"-"`
	// AgentTool, when set, is berth-agent's own tool the secret is for: it is
	// added to berth-agent's own requests only (channel.go), never a tool's.
	AgentTool string `json:"agent_tool,omitempty"`
}

// For says whether the secret is for a tunnel to host:port.
func (s Secret) For(host string, port int) bool {
	return slices.Contains(s.Hosts, NormalHost(host)) && (len(s.Ports) == 0 || slices.Contains(s.Ports, port))
}

// Covers says whether a request inside the secret's tunnel gets the
// secret, and if not, why. escapedPath is the path as sent; a path scope
// is judged only on a plain one (no dot segment, no percent-encoded '/',
// '.' or '\', no empty segment), since the origin may read another form
// differently than the proxy.
func (s Secret) Covers(method, escapedPath string) (bool, string) {
	if len(s.Methods) > 0 && !slices.Contains(s.Methods, strings.ToUpper(method)) {
		return false, fmt.Sprintf("secret %s is for %s only, not %s: sent without it", s.Name, strings.Join(s.Methods, ", "), method)
	}
	if len(s.Paths) == 0 {
		return true, ""
	}
	if !PlainPath(escapedPath) {
		return false, fmt.Sprintf("secret %s: the path %q is not plain (dot segments, encoded separators or empty segments): sent without it", s.Name, escapedPath)
	}
	for _, p := range s.Paths {
		if PathUnder(escapedPath, p) {
			return true, ""
		}
	}
	return false, fmt.Sprintf("secret %s is for paths %s only: sent without it", s.Name, strings.Join(s.Paths, ", "))
}

// PlainPath says whether an escaped path reads the same to every server:
// absolute, no "." or ".." segment, no empty segment (but a trailing
// "/"), no percent-encoded '/', '.', '\' or '%', no backslash.
func PlainPath(p string) bool {
	if !strings.HasPrefix(p, "/") || strings.Contains(p, "\\") {
		return false
	}
	lower := strings.ToLower(p)
	for _, enc := range []string{"%2f", "%2e", "%5c", "%25"} {
		if strings.Contains(lower, enc) {
			return false
		}
	}
	segs := strings.Split(p[1:], "/")
	for i, seg := range segs {
		if seg == "." || seg == ".." || seg == "" && i != len(segs)-1 {
			return false
		}
	}
	return true
}

// PathUnder says whether p is prefix or below it (segment boundary).
func PathUnder(p, prefix string) bool {
	prefix = strings.TrimSuffix(prefix, "/")
	return p == prefix || strings.HasPrefix(p, prefix+"/")
}

// CheckSecretPath says why a configured path scope is not one, or nil.
func CheckSecretPath(p string) error {
	if !PlainPath(p) || strings.ContainsAny(p, "?#*") {
		return fmt.Errorf("%q is not a path prefix: absolute, plain (no dot or empty segments, no encoded separators), no query or glob", p)
	}
	return nil
}

// CheckFronting says why a request inside a tunnel to host:port names
// another origin, or nil: its Host header, and its absolute URL if it has
// one, must be the tunnel's target (case and a trailing dot aside; the
// port may be left out when it is the scheme's default). On a shared front
// end, another Host is another site, and it must not get this one's secret.
func CheckFronting(host string, port int, r *http.Request) error {
	if r.URL != nil && r.URL.Host != "" {
		if !sameOrigin(host, port, r.URL.Host) {
			return fmt.Errorf("the request's URL names %s, not the tunnel's %s", r.URL.Host, net.JoinHostPort(host, strconv.Itoa(port)))
		}
	}
	if !sameOrigin(host, port, r.Host) {
		return fmt.Errorf("the request's Host %q is not the tunnel's %s", r.Host, net.JoinHostPort(host, strconv.Itoa(port)))
	}
	return nil
}

func sameOrigin(host string, port int, hostport string) bool {
	if hostport == "" || strings.ContainsAny(hostport, "@/ ") {
		return false
	}
	h, p := hostport, 443
	if strings.LastIndex(hostport, ":") > strings.LastIndex(hostport, "]") {
		var ps string
		var err error
		h, ps, err = net.SplitHostPort(hostport)
		if err != nil {
			return false
		}
		if p, err = strconv.Atoi(ps); err != nil {
			return false
		}
	}
	return NormalHost(h) == NormalHost(host) && p == port
}
