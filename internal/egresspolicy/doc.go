// Package egresspolicy is the one place where berth decides what a
// sandboxed run may send out through its egress proxy: the allow rules and
// their parser, which destination addresses count as internal, which
// provider endpoints get the admin's key and with which headers, where an
// [[egress.secrets]] entry applies, and the decisions and verdicts that
// record it. The proxy (services/egress), the plan (internal/runplan), the
// config checks (internal/config) and `berthctl egress explain` all judge
// with this code, so the explanation is the proxy's decision, not a copy
// of it (docs/adr/0011-egress-gateway.md).
//
// It is a leaf: it imports nothing of berth, so both the host side and
// the config can use it.
package egresspolicy
