package egresspolicy_test

import (
	"context"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/egresspolicy"
)

// Explain says what the proxy does with an https request an ask rule with
// methods names: that method is held inside the tunnel, another refused;
// an ask rule for "*" stays plain http only.
func TestExplainHoldsTheAskedMethodOfAnHTTPSRequest(t *testing.T) {
	t.Parallel()
	var ask []egresspolicy.Rule
	for _, s := range []string{"POST api.stripe.com", "DELETE *"} {
		r, err := egresspolicy.ParseRule(s)
		if err != nil {
			t.Fatal(err)
		}
		ask = append(ask, r)
	}
	j := &egresspolicy.Judge{Ask: ask}
	tests := []struct {
		method, url string
		rule, want  string
	}{
		{"POST", "https://api.stripe.com/v1/charges", "POST api.stripe.com", "asks a person first"},
		{"GET", "https://api.stripe.com/v1/charges", "", "no [agents.egress] allow rule matches GET api.stripe.com:443"},
		{"POST", "https://api.other.com/", "", "no [agents.egress] allow rule matches CONNECT api.other.com:443"},
		{"DELETE", "https://x.example/", "", "no [agents.egress] allow rule matches CONNECT x.example:443"}, // no CA covers "*"
		{"DELETE", "http://x.example/", "DELETE *", "asks a person first"},
	}
	for _, tc := range tests {
		v, err := j.Explain(context.Background(), egresspolicy.Question{Method: tc.method, URL: tc.url})
		if err != nil {
			t.Fatal(err)
		}
		if v.Allowed || v.Rule != tc.rule || !strings.Contains(v.Reason, tc.want) {
			t.Errorf("%s %s: %+v, want refused (rule %q) with %q", tc.method, tc.url, v, tc.rule, tc.want)
		}
	}
	for _, h := range []string{"api.stripe.com"} {
		if got := egresspolicy.InsideAskHosts(ask); len(got) != 1 || got[0] != h {
			t.Errorf("InsideAskHosts = %v, want [%s]", got, h)
		}
	}
}
