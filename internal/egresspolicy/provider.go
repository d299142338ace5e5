package egresspolicy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path"
	"regexp"
	"slices"
	"strings"
)

// Provider is a provider the run may call: its endpoint, the only model
// the proxy lets through, what the admin set for its calls, and its key.
// Key is never marshalled: plans and run records carry the endpoint only;
// the proxy gets the key on its stdin (services/egress.Policy).
type Provider struct {
	Name    string `json:"name"`
	Kind    string `json:"kind"`
	BaseURL string `json:"base_url"`
	Model   string `json:"model"`
	// Endpoints are the API paths under BaseURL that get the key
	// (DefaultEndpoints of the kind when empty).
	Endpoints []string `json:"endpoints,omitempty"`
	// APIVersion is anthropic-version for an anthropic provider.
	APIVersion string `json:"api_version,omitempty"`
	// Organization and Project scope an OpenAI key's billing; only the
	// admin sets them, never the sandbox.
	Organization string `json:"organization,omitempty"`
	Project      string `json:"project,omitempty"`
	// Prices are [providers.X.prices] by model (usage.go).
	Prices map[string]Price `json:"prices,omitempty"`
	Key    string           `json:"-"`
}

// DefaultEndpoints are the paths under the base URL a provider kind's key
// is good for, as the agent calls them.
var DefaultEndpoints = map[string][]string{
	"openai":    {"chat/completions", "responses", "embeddings", "models"},
	"anthropic": {"v1/messages", "v1/messages/count_tokens"},
}

// modelsEndpoint lists models: the one endpoint read with GET (no body,
// no model to check, nothing spent).
const modelsEndpoint = "models"

// endpointPattern is what an endpoint path may be: plain segments.
var endpointPattern = regexp.MustCompile(`^[A-Za-z0-9_-]+(/[A-Za-z0-9_-]+)*$`)

// CheckEndpoint says why e cannot be a provider endpoint, or nil.
func CheckEndpoint(e string) error {
	if !endpointPattern.MatchString(e) {
		return fmt.Errorf("%q is not an endpoint path under the base URL (segments of letters, digits, '-' and '_', like \"chat/completions\")", e)
	}
	return nil
}

// ProviderEndpoints are the endpoints of p that get its key.
func (p Provider) ProviderEndpoints() []string {
	if len(p.Endpoints) > 0 {
		return p.Endpoints
	}
	return DefaultEndpoints[p.Kind]
}

// BaseURLParsed is p's base URL, checked to be an absolute http(s) URL.
func (p Provider) BaseURLParsed() (*url.URL, error) {
	u, err := url.Parse(p.BaseURL)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") || u.User != nil {
		return nil, fmt.Errorf("provider %s: base URL %q is not an absolute http(s) URL", p.Name, p.BaseURL)
	}
	return u, nil
}

// ProviderCall is a provider request the proxy may send: the provider, the
// endpoint it calls and the URL it goes to (no query: none is needed).
type ProviderCall struct {
	Provider *Provider
	Endpoint string
	URL      *url.URL
}

// Refusal is a request the proxy refuses: the HTTP status and the reason
// the 403 (or other) body and the decision carry.
type Refusal struct {
	Code   int
	Reason string
	// Ask, when set, is the ask rule that matched a request nothing allows:
	// the proxy holds it for a person's answer (ask.go); a caller that
	// cannot hold it refuses it with Reason, like any refusal.
	Ask *Rule
}

func (r *Refusal) Error() string { return r.Reason }

func refused(code int, format string, args ...any) *Refusal {
	return &Refusal{Code: code, Reason: fmt.Sprintf(format, args...)}
}

// ProvidersPrefix is where the sandbox calls its providers on the proxy.
const ProvidersPrefix = "/providers/"

// Provider judges a call to escapedPath (the request's path as sent, still
// percent-encoded, starting with ProvidersPrefix): the key goes only to
// one of the provider's own endpoints, named plainly — no dot segments,
// no percent-encoding at all (so no %2e%2e%2f, %2f or double encoding), no
// empty segment, nothing after the endpoint — with POST (GET for models).
func (j *Judge) Provider(method, escapedPath string) (ProviderCall, *Refusal) {
	rest, ok := strings.CutPrefix(escapedPath, ProvidersPrefix)
	if !ok {
		return ProviderCall{}, refused(http.StatusBadRequest, "%q is not under %s", escapedPath, ProvidersPrefix)
	}
	name, endpoint, _ := strings.Cut(rest, "/")
	var p *Provider
	for i := range j.Providers {
		if j.Providers[i].Name == name {
			p = &j.Providers[i]
		}
	}
	if p == nil {
		return ProviderCall{}, refused(http.StatusForbidden, "%q is not one of the run's providers", name)
	}
	base, err := p.BaseURLParsed()
	if err != nil {
		return ProviderCall{}, refused(http.StatusForbidden, "%v", err)
	}
	if !endpointPattern.MatchString(endpoint) {
		return ProviderCall{}, refused(http.StatusForbidden, "provider %s: %q is not a plain API path (no dot segments, percent-encoding, empty segments or other characters); the key goes only to %s under %s",
			p.Name, endpoint, strings.Join(p.ProviderEndpoints(), ", "), p.BaseURL)
	}
	if !slices.Contains(p.ProviderEndpoints(), endpoint) {
		return ProviderCall{}, refused(http.StatusForbidden, "provider %s: %q is not one of its API endpoints; the key goes only to %s under %s",
			p.Name, endpoint, strings.Join(p.ProviderEndpoints(), ", "), p.BaseURL)
	}
	want := http.MethodPost
	if endpoint == modelsEndpoint {
		want = http.MethodGet
	}
	if method != want {
		return ProviderCall{}, refused(http.StatusForbidden, "provider %s: %s takes %s, not %s", p.Name, endpoint, want, method)
	}
	target := *base
	target.Path = path.Join("/", base.Path, endpoint)
	target.RawPath, target.RawQuery, target.Fragment = "", "", ""
	return ProviderCall{Provider: p, Endpoint: endpoint, URL: &target}, nil
}

// NeedsModel says whether the call's body must name the agent's model.
func (c ProviderCall) NeedsModel() bool { return c.Endpoint != modelsEndpoint }

// CheckModel says why body is not a call with model, or nil. It reads the
// body strictly, the way no provider could read it differently: exactly
// one JSON object; at its top level no key twice and no case variant of
// "model" (Go and other decoders match keys without case); "model" a
// string equal to model. Nested objects may hold any keys.
func CheckModel(body []byte, model string) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil || tok != json.Delim('{') {
		return errors.New("the request body is not a JSON object")
	}
	seen := map[string]bool{}
	var got *string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return errors.New("the request body is not valid JSON")
		}
		key := tok.(string)
		if seen[key] {
			return fmt.Errorf("the request body has the key %q twice", key)
		}
		seen[key] = true
		if strings.EqualFold(key, "model") && key != "model" {
			return fmt.Errorf("the request body has the key %q, a case variant of \"model\"", key)
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return errors.New("the request body is not valid JSON")
		}
		if key == "model" {
			var s string
			// null decodes into a string without error: only a JSON string is one.
			if len(v) == 0 || v[0] != '"' || json.Unmarshal(v, &s) != nil {
				return errors.New("the request body's model is not a string")
			}
			got = &s
		}
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim('}') {
		return errors.New("the request body is not valid JSON")
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("the request body holds more than one JSON value")
	}
	if got == nil {
		return errors.New("the request body names no model")
	}
	if *got != model {
		return fmt.Errorf("model %q is not the agent's model %q", *got, model)
	}
	return nil
}

// forwardedProviderHeaders are the only headers of the sandbox's that a
// provider call carries: what the body is and how the answer may come
// back. Everything else (cookies, OpenAI-Organization, OpenAI-Project,
// anthropic-beta, x-forwarded-*, the SDK's own) is dropped.
var forwardedProviderHeaders = []string{"Content-Type", "Accept", "Accept-Encoding", "User-Agent"}

// anthropicVersionPattern is a plausible anthropic-version: a date.
var anthropicVersionPattern = regexp.MustCompile(`^[0-9]{4}-[0-9]{2}-[0-9]{2}$`)

// ProviderHeaders are the headers a call to p carries: the allowed ones
// of the sandbox's in, the key, and what the admin configured. For an
// anthropic provider, anthropic-version is api_version when set, else the
// sandbox's if it is a date (the SDK's own choice of API shape, which
// spends nothing more), else none.
func ProviderHeaders(p Provider, in http.Header) http.Header {
	out := http.Header{}
	for _, k := range forwardedProviderHeaders {
		if v := in.Values(k); len(v) > 0 {
			out[k] = slices.Clone(v)
		}
	}
	switch p.Kind {
	case "anthropic":
		out.Set("X-Api-Key", p.Key)
		switch v := in.Get("Anthropic-Version"); {
		case p.APIVersion != "":
			out.Set("Anthropic-Version", p.APIVersion)
		case anthropicVersionPattern.MatchString(v):
			out.Set("Anthropic-Version", v)
		}
	default:
		out.Set("Authorization", "Bearer "+p.Key)
		if p.Organization != "" {
			out.Set("OpenAI-Organization", p.Organization)
		}
		if p.Project != "" {
			out.Set("OpenAI-Project", p.Project)
		}
	}
	return out
}
