package egresspolicy

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
)

func TestTheModelIsReadStrictly(t *testing.T) {
	t.Parallel()
	tests := []struct{ body, want string }{
		{`{"model":"m"}`, ""},
		{` {"messages":[{"model":"x"}],"model":"m"} `, ""},
		{`{"model":"m","Model":"m"}`, "case variant"},
		{`{"moDel":"x","model":"m"}`, "case variant"},
		{`{"model":"m","model":"m"}`, "twice"},
		{`{"model":"m"} {}`, "more than one JSON value"},
		{`{"model":"m"`, "not valid JSON"},
		{`"m"`, "not a JSON object"},
		{`null`, "not a JSON object"},
		{`{"model":null}`, "not a string"},
		{`{"model":"x"}`, `model "x" is not the agent's model "m"`},
		{`{}`, "names no model"},
		{``, "not a JSON object"},
	}
	for _, tt := range tests {
		err := CheckModel([]byte(tt.body), "m")
		if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
			t.Errorf("CheckModel(%s) = %v, want %q", tt.body, err, tt.want)
		}
	}
}

func TestARequestInsideATunnelMustNameItsOrigin(t *testing.T) {
	t.Parallel()
	tests := []struct {
		host, url string
		ok        bool
	}{
		{"api.github.com", "", true},
		{"API.GitHub.com.", "", true},
		{"api.github.com:443", "", true},
		{"api.github.com:8443", "", false},
		{"other.example", "", false},
		{"", "", false},
		{"api.github.com@other.example", "", false},
		{"api.github.com", "https://api.github.com/user", true},
		{"api.github.com", "https://other.example/user", false},
		{"api.github.com", "https://api.github.com:444/user", false},
	}
	for _, tt := range tests {
		r := &http.Request{Host: tt.host, URL: &url.URL{Path: "/user"}}
		if tt.url != "" {
			r.URL, _ = url.Parse(tt.url)
		}
		if err := CheckFronting("api.github.com", 443, r); (err == nil) != tt.ok {
			t.Errorf("Host %q URL %q: %v, want ok=%v", tt.host, tt.url, err, tt.ok)
		}
	}
}

func TestASecretsPathScopeIsJudgedOnPlainPathsOnly(t *testing.T) {
	t.Parallel()
	sec := Secret{Name: "gh", Methods: []string{"GET"}, Paths: []string{"/repos/acme/"}}
	tests := []struct {
		method, path string
		ok           bool
	}{
		{"GET", "/repos/acme", true},
		{"get", "/repos/acme/x/", true},
		{"GET", "/repos/acmex", false},
		{"POST", "/repos/acme", false},
		{"GET", "/repos/acme/../../user", false},
		{"GET", "/repos/acme/%2e%2e/user", false},
		{"GET", "/repos/acme%2f..%2fuser", false},
		{"GET", "/repos//acme", false},
		{"GET", "/repos/acme/%252e", false},
		{"GET", `/repos/acme\..\user`, false},
	}
	for _, tt := range tests {
		if ok, why := sec.Covers(tt.method, tt.path); ok != tt.ok {
			t.Errorf("%s %s covered = %v (%s), want %v", tt.method, tt.path, ok, why, tt.ok)
		}
	}
}
