package egresspolicy

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
)

// internalRange is an address range that is not on the internet, and why.
type internalRange struct {
	prefix netip.Prefix
	why    string
}

func ranges(why string, prefixes ...string) []internalRange {
	out := make([]internalRange, 0, len(prefixes))
	for _, p := range prefixes {
		out = append(out, internalRange{netip.MustParsePrefix(p), why})
	}
	return out
}

// internalRanges are the special-purpose ranges (IANA's IPv4 and IPv6
// registries) a tool must not reach through a rule that does not name the
// host. Forms that embed an IPv4 address are decoded first (embeddedIPv4).
var internalRanges = slices.Concat(
	ranges("a loopback address", "127.0.0.0/8", "::1/128"),
	ranges("an unspecified address", "0.0.0.0/8", "::/128"),
	ranges("a link-local address (cloud metadata lives there)", "169.254.0.0/16", "fe80::/10"),
	ranges("a private address", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7", "fec0::/10"),
	ranges("a shared (carrier-grade NAT) address", "100.64.0.0/10"),
	ranges("a protocol-assignment address", "192.0.0.0/24", "192.88.99.0/24", "2001:10::/28", "2001:20::/28"),
	ranges("a benchmarking address", "198.18.0.0/15", "2001:2::/48"),
	ranges("a documentation address", "192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32", "3fff::/20"),
	ranges("a broadcast address", "255.255.255.255/32"),
	ranges("a reserved address", "240.0.0.0/4", "100::/64"),
	ranges("a multicast address", "224.0.0.0/4", "ff00::/8"),
	ranges("a local-use NAT64 address", "64:ff9b:1::/48"),
)

var (
	nat64     = netip.MustParsePrefix("64:ff9b::/96")
	sixToFour = netip.MustParsePrefix("2002::/16")
	teredo    = netip.MustParsePrefix("2001::/32")
	compat    = netip.MustParsePrefix("::/96")
	siit      = netip.MustParsePrefix("::ffff:0:0:0/96")
)

// embeddedIPv4 are the IPv4 addresses an IPv6 address carries, by form:
// IPv4-mapped and -translated, IPv4-compatible, NAT64, 6to4 and Teredo
// (server and de-obfuscated client). A packet to such an address ends at
// (or is relayed towards) the IPv4 one, so that is what is judged.
func embeddedIPv4(a netip.Addr) []netip.Addr {
	if !a.Is6() || a.Is4In6() {
		return nil
	}
	b := a.As16()
	v4 := func(i int) netip.Addr { return netip.AddrFrom4([4]byte(b[i : i+4])) }
	switch {
	case siit.Contains(a), nat64.Contains(a):
		return []netip.Addr{v4(12)}
	case compat.Contains(a):
		if a.IsLoopback() || a.IsUnspecified() {
			return nil
		}
		return []netip.Addr{v4(12)}
	case sixToFour.Contains(a):
		return []netip.Addr{v4(2)}
	case teredo.Contains(a):
		client := binary.BigEndian.Uint32(b[12:]) ^ 0xffffffff
		var c [4]byte
		binary.BigEndian.PutUint32(c[:], client)
		return []netip.Addr{v4(4), netip.AddrFrom4(c)}
	}
	return nil
}

// Classifier says which addresses are internal: the special-purpose ranges,
// and this host's own networks (its interfaces' subnets) and gateways.
type Classifier struct {
	networks []netip.Prefix
	gateways []netip.Addr
}

// NewClassifier judges with networks as this host's subnets and gateways
// as its routers (tests give them; HostClassifier reads them).
func NewClassifier(networks []netip.Prefix, gateways []netip.Addr) *Classifier {
	c := &Classifier{}
	for _, p := range networks {
		c.networks = append(c.networks, netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-unmapBits(p)).Masked())
	}
	for _, g := range gateways {
		c.gateways = append(c.gateways, g.Unmap())
	}
	return c
}

func unmapBits(p netip.Prefix) int {
	if p.Addr().Is4In6() {
		return 96
	}
	return 0
}

// HostClassifier reads this host's interface subnets (net.Interfaces) and
// default gateways (/proc/net/route, /proc/net/ipv6_route). What cannot
// be read is left out; the special-purpose ranges hold regardless.
func HostClassifier() *Classifier {
	var networks []netip.Prefix
	if ifaces, err := net.Interfaces(); err == nil {
		for _, ifc := range ifaces {
			addrs, err := ifc.Addrs()
			if err != nil {
				continue
			}
			for _, a := range addrs {
				if p, err := netip.ParsePrefix(a.String()); err == nil {
					networks = append(networks, p)
				}
			}
		}
	}
	gateways := append(routeGateways("/proc/net/route", parseIPv4Route), routeGateways("/proc/net/ipv6_route", parseIPv6Route)...)
	return NewClassifier(networks, gateways)
}

func routeGateways(path string, parse func([]string) (netip.Addr, bool)) []netip.Addr {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []netip.Addr
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if a, ok := parse(strings.Fields(sc.Text())); ok && !a.IsUnspecified() {
			out = append(out, a)
		}
	}
	return out
}

// parseIPv4Route reads the gateway of a /proc/net/route line (Iface
// Destination Gateway …, hex in host byte order, little-endian here).
func parseIPv4Route(f []string) (netip.Addr, bool) {
	if len(f) < 3 || len(f[2]) != 8 {
		return netip.Addr{}, false
	}
	b, err := hex.DecodeString(f[2])
	if err != nil {
		return netip.Addr{}, false
	}
	return netip.AddrFrom4([4]byte{b[3], b[2], b[1], b[0]}), true
}

// parseIPv6Route reads the next hop of a /proc/net/ipv6_route line (dest
// plen src plen nexthop …, 32 hex digits each).
func parseIPv6Route(f []string) (netip.Addr, bool) {
	if len(f) < 5 || len(f[4]) != 32 {
		return netip.Addr{}, false
	}
	b, err := hex.DecodeString(f[4])
	if err != nil {
		return netip.Addr{}, false
	}
	return netip.AddrFrom16([16]byte(b)), true
}

// Internal says why a is not a destination on the internet, or "" when it
// is. A nil Classifier judges the special-purpose ranges only.
func (c *Classifier) Internal(a netip.Addr) string {
	a = a.Unmap().WithZone("")
	for _, r := range internalRanges {
		if r.prefix.Contains(a) {
			return r.why
		}
	}
	for _, v4 := range embeddedIPv4(a) {
		if why := c.Internal(v4); why != "" {
			return fmt.Sprintf("an IPv6 address embedding %s, %s", v4, why)
		}
	}
	if c == nil {
		return ""
	}
	for _, g := range c.gateways {
		if g == a {
			return "a gateway of this host"
		}
	}
	for _, p := range c.networks {
		if p.Contains(a) {
			return "on a network of this host (" + p.String() + ")"
		}
	}
	return ""
}
