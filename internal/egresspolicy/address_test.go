package egresspolicy

import (
	"net/netip"
	"strings"
	"testing"
)

func TestInternalAddressesAreRefusedInEveryNotation(t *testing.T) {
	t.Parallel()
	host := NewClassifier(
		[]netip.Prefix{netip.MustParsePrefix("203.0.114.10/24"), netip.MustParsePrefix("2a01:4f8:1:2::10/64")},
		[]netip.Addr{netip.MustParseAddr("198.100.7.1"), netip.MustParseAddr("2a01:4f8:1:3::1")},
	)
	tests := []struct {
		addr, want string // want "" for a public address
	}{
		{"127.0.0.1", "loopback"},
		{"127.8.9.10", "loopback"},
		{"::1", "loopback"},
		{"::ffff:127.0.0.1", "loopback"},
		{"0.0.0.0", "unspecified"},
		{"0.1.2.3", "unspecified"},
		{"::", "unspecified"},
		{"169.254.169.254", "link-local"},
		{"fe80::1", "link-local"},
		{"10.1.2.3", "private"},
		{"172.16.0.1", "private"},
		{"172.31.255.255", "private"},
		{"192.168.1.1", "private"},
		{"fd00::1", "private"},
		{"fc00::1", "private"},
		{"fec0::1", "private"},
		{"100.64.0.1", "shared"},
		{"100.127.255.254", "shared"},
		{"198.18.0.1", "benchmarking"},
		{"198.19.255.255", "benchmarking"},
		{"240.0.0.1", "reserved"},
		{"255.255.255.255", "broadcast"},
		{"224.0.0.1", "multicast"},
		{"239.255.255.250", "multicast"},
		{"ff02::1", "multicast"},
		{"192.0.2.1", "documentation"},
		{"198.51.100.1", "documentation"},
		{"203.0.113.1", "documentation"},
		{"2001:db8::1", "documentation"},
		{"192.0.0.8", "protocol-assignment"},
		{"64:ff9b::7f00:1", "embedding 127.0.0.1"},
		{"64:ff9b::a9fe:a9fe", "embedding 169.254.169.254"},
		{"64:ff9b:1::8.8.8.8", "local-use NAT64"},
		{"2002:7f00:1::1", "embedding 127.0.0.1"},
		{"2002:a00:1::", "embedding 10.0.0.1"},
		{"::127.0.0.1", "embedding 127.0.0.1"},
		{"::10.0.0.1", "embedding 10.0.0.1"},
		{"::ffff:0:10.0.0.1", "embedding 10.0.0.1"},
		// Teredo: server 65.54.227.120, client 127.0.0.1 obfuscated (xor).
		{"2001:0:4136:e378:8000:63bf:80ff:fffe", "embedding 127.0.0.1"},
		{"203.0.114.99", "network of this host"},
		{"2a01:4f8:1:2::99", "network of this host"},
		{"198.100.7.1", "gateway of this host"},
		{"2a01:4f8:1:3::1", "gateway of this host"},
		{"8.8.8.8", ""},
		{"1.1.1.1", ""},
		{"2606:4700:4700::1111", ""},
		{"64:ff9b::808:808", ""},
		{"2002:808:808::1", ""},
		{"::ffff:8.8.8.8", ""},
		{"198.100.7.2", ""},
	}
	for _, tt := range tests {
		t.Run(tt.addr, func(t *testing.T) {
			t.Parallel()
			got := host.Internal(netip.MustParseAddr(tt.addr))
			if tt.want == "" && got != "" || tt.want != "" && !strings.Contains(got, tt.want) {
				t.Fatalf("Internal(%s) = %q, want %q", tt.addr, got, tt.want)
			}
		})
	}
}

func TestTheHostsNetworksAndGatewaysAreRead(t *testing.T) {
	t.Parallel()
	c := HostClassifier()
	// Every Linux host has a loopback network; whatever else it has, an
	// address of each of its networks is internal.
	for _, p := range c.networks {
		if why := c.Internal(p.Addr()); why == "" {
			t.Errorf("%s, on this host's network %s, is not internal", p.Addr(), p)
		}
	}
	if a, ok := parseIPv4Route(strings.Fields("eth0	00000000	0100A8C0	0003	0	0	100	00000000	0	0	0")); !ok || a != netip.MustParseAddr("192.168.0.1") {
		t.Fatalf("the default gateway of a /proc/net/route line: %v %v", a, ok)
	}
	if a, ok := parseIPv6Route(strings.Fields("00000000000000000000000000000000 00 00000000000000000000000000000000 00 fe800000000000000000000000000001 00000400 00000001 00000000 00000003 eth0")); !ok || a != netip.MustParseAddr("fe80::1") {
		t.Fatalf("the default gateway of a /proc/net/ipv6_route line: %v %v", a, ok)
	}
}
