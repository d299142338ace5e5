package egresspolicy

import (
	"context"
	"net/netip"
	"strings"
	"testing"
)

func mustRules(t *testing.T, raw ...string) []Rule {
	t.Helper()
	var out []Rule
	for _, s := range raw {
		r, err := ParseRule(s)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	return out
}

func TestAnAskRuleHoldsWhatNoAllowRuleAllows(t *testing.T) {
	t.Parallel()
	j := &Judge{Allow: mustRules(t, "pypi.org"), Ask: mustRules(t, "*.example.com", "POST api.stripe.com", "pypi.org")}
	tests := []struct {
		name, method, host string
		port               int
		wantAsk            string // the ask rule that holds it; "" for none
		wantAllowed        bool
	}{
		{"A_host_in_allow_and_ask_is_allowed_without_asking", "CONNECT", "pypi.org", 443, "", true},
		{"A_glob_ask_rule_holds_a_tunnel", "CONNECT", "shop.example.com", 443, "*.example.com", false},
		{"A_method_ask_rule_holds_that_method", "POST", "api.stripe.com", 80, "POST api.stripe.com", false},
		{"A_method_ask_rule_leaves_other_methods_refused", "GET", "api.stripe.com", 80, "", false},
		{"A_host_no_rule_names_is_refused", "CONNECT", "other.org", 443, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, ref := j.Destination(context.Background(), tt.method, tt.host, tt.port)
			if tt.wantAllowed != (ref == nil) {
				t.Fatalf("refusal = %v, want allowed %v", ref, tt.wantAllowed)
			}
			got := ""
			if ref != nil && ref.Ask != nil {
				got = ref.Ask.Raw
			}
			if got != tt.wantAsk {
				t.Fatalf("ask rule = %q, want %q (refusal %v)", got, tt.wantAsk, ref)
			}
		})
	}
}

func TestAnApprovedAskRuleReachesNoInternalAddressItDoesNotName(t *testing.T) {
	t.Parallel()
	j := &Judge{Ask: mustRules(t, "*.example.com"), Resolver: fixedResolver{netip.MustParseAddr("10.0.0.7")}}
	_, ref := j.DestinationBy(context.Background(), j.Ask[0], "shop.example.com", 443)
	if ref == nil || !strings.Contains(ref.Reason, "only a rule naming shop.example.com exactly") {
		t.Fatalf("refusal = %v, want the internal address refused", ref)
	}
}

func TestExplainSaysAnAskRuleHoldsTheRequest(t *testing.T) {
	t.Parallel()
	j := &Judge{Ask: mustRules(t, "*.example.com")}
	v, err := j.Explain(context.Background(), Question{Method: "GET", URL: "https://shop.example.com/cart"})
	if err != nil {
		t.Fatal(err)
	}
	if v.Allowed || v.Rule != "*.example.com" || !strings.Contains(v.Reason, "asks a person first") {
		t.Fatalf("verdict = %+v, want held by ask rule *.example.com", v)
	}
}

type fixedResolver []netip.Addr

func (r fixedResolver) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	return r, nil
}
