package egress_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/berth-dev/berth/services/egress"
)

// The proxy adds the run's traceparent to provider calls only when the
// policy carries one (provider_traceparent = true); a traceparent the
// sandbox sends never reaches the provider, since the proxy forwards only
// its allow-list of headers.
func TestProviderCallsCarryTheRunsTraceparentOnlyWhenAsked(t *testing.T) {
	t.Parallel()
	const (
		runTP     = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
		sandboxTP = "00-11111111111111111111111111111111-2222222222222222-01"
	)
	var mu sync.Mutex
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Header.Get("Traceparent"))
		mu.Unlock()
		io.WriteString(w, `{"choices":[{"message":{"role":"assistant","content":"hi"}}]}`)
	}))
	t.Cleanup(srv.Close)
	for _, tc := range []struct {
		name, policyTP, want string
	}{
		{"on_the_run_s_traceparent_replaces_the_sandbox_s", runTP, runTP},
		{"off_none_not_even_the_sandbox_s", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pol := egress.Policy{RunID: "r1", Agent: "ops", Traceparent: tc.policyTP, Providers: []egress.Provider{
				{Name: "openai", Kind: "openai", BaseURL: srv.URL + "/v1", Model: "m", Key: openKey},
			}}
			// As berth-egress gets it: through its stdin's JSON.
			raw, err := json.Marshal(pol)
			if err != nil {
				t.Fatal(err)
			}
			var back egress.Policy
			if err := json.Unmarshal(raw, &back); err != nil {
				t.Fatal(err)
			}
			p := startProxy(t, back, egress.Options{})
			mu.Lock()
			got = nil
			mu.Unlock()
			code, body := do(t, p.origin(token), "POST", "http://egress/providers/openai/chat/completions", `{"model":"m"}`, "Traceparent", sandboxTP)
			if code != http.StatusOK {
				t.Fatalf("provider call: %d %s", code, body)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(got) != 1 || got[0] != tc.want {
				t.Errorf("the provider got traceparent %q, want %q", got, tc.want)
			}
		})
	}
}
