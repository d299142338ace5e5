package egress

import (
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/egresspolicy"
)

func TestGitSecretGoesToTheForgesAPIOnlyWhenItNamesTheAPIHost(t *testing.T) {
	t.Parallel()
	rule := egresspolicy.GitRule{Remote: "https://github.com/acme/web.git", Fetch: true, Push: []string{"berth/*"}, Credential: "pat"}
	for _, tc := range []struct {
		name    string
		hosts   []string
		wantAPI bool
	}{
		{"Not_asked_of_the_API_with_a_secret_for_github_com_only", []string{"github.com"}, false},
		{"Asked_of_the_API_with_a_secret_that_names_it", []string{"github.com", "api.github.com"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			sec := Secret{Name: "pat", Hosts: tc.hosts, Header: "Authorization", Format: "Bearer {}", Value: "pat_SECRET"}
			g, err := newGitState(Policy{Agent: "web", Git: []egresspolicy.GitRule{rule}, Secrets: []Secret{sec}}, nil, time.Second)
			if err != nil {
				t.Fatal(err)
			}
			c, err := g.credential(t.Context(), rule)
			if err != nil {
				t.Fatal(err)
			}
			if c.value != "Bearer pat_SECRET" {
				t.Errorf("the git request's credential is %q", c.value)
			}
			if got := c.apiAuth != ""; got != tc.wantAPI {
				t.Errorf("the secret goes to the API %q: %v, want %v", c.api, got, tc.wantAPI)
			}
		})
	}
}
