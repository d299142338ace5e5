package tools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/berth-dev/berth/agent/provider"
	"github.com/berth-dev/berth/internal/agentproto"
)

// web_search limits.
const (
	WebSearchTimeout  = 20 * time.Second
	WebSearchMaxCount = 10
	webSearchDefault  = 5
	webSearchMaxBody  = 2 << 20
	searchTitleLimit  = 200  // characters
	searchURLLimit    = 2048 // bytes; a longer URL is left out
	searchSnipLimit   = 500  // characters
)

// Web search providers (agentproto.WebSearch.Kind).
const (
	SearchSearXNG = "searxng"
	SearchBrave   = "brave"
)

// SearchResult is one hit web_search returns.
type SearchResult struct {
	Title   string `json:"title"`
	URL     string `json:"url"`
	Snippet string `json:"snippet,omitempty"`
}

// WebSearch is the web_search tool for the request's provider; none when
// the request has no provider.
func WebSearch(env Env, cfg *agentproto.WebSearch) []Tool {
	if cfg == nil {
		return nil
	}
	return []Tool{webSearch{env: env, cfg: *cfg}}
}

type webSearch struct {
	env Env
	cfg agentproto.WebSearch
}

func (webSearch) Spec() provider.Tool {
	return provider.Tool{
		Name: "web_search",
		Description: "Search the web. Returns JSON with results, each a title, url and snippet (count: 1 to 10, default 5). " +
			"Use web_fetch to read a result.",
		Parameters: schema(`{"type":"object","properties":{"query":{"type":"string"},"count":{"type":"integer","minimum":1,"maximum":10}},"required":["query"],"additionalProperties":false}`),
	}
}

func (t webSearch) Call(ctx context.Context, raw json.RawMessage) (string, error) {
	var args struct {
		Query string `json:"query"`
		Count int    `json:"count"`
	}
	if err := decodeArgs(raw, &args); err != nil {
		return "", err
	}
	query := strings.TrimSpace(args.Query)
	if query == "" {
		return "", errors.New("bad arguments: query is empty")
	}
	if args.Count < 0 || args.Count > WebSearchMaxCount {
		return "", fmt.Errorf("bad arguments: count must be 1 to %d", WebSearchMaxCount)
	}
	count := args.Count
	if count == 0 {
		count = webSearchDefault
	}
	if !t.env.Network {
		return "", errors.New("this agent has no network access and no egress proxy for web_search")
	}
	endpoint, err := t.endpoint(query, count)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, WebSearchTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, endpoint.String(), nil)
	if err != nil {
		return "", fmt.Errorf("cannot build the search request: %w", err)
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "berth-agent web_search")
	transport, err := t.env.ownTransport()
	if err != nil {
		return "", err
	}
	client := &http.Client{Transport: transport, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		return "", fmt.Errorf("cannot reach the %s search at %s: %w", t.cfg.Kind, endpoint.Redacted(), err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, webSearchMaxBody))
	if err != nil {
		return "", fmt.Errorf("cannot read the %s search's answer: %w", t.cfg.Kind, err)
	}
	if resp.StatusCode != http.StatusOK {
		hint := ""
		if t.cfg.Kind == SearchBrave && (resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden || resp.StatusCode == 422) {
			hint = " (the egress proxy adds the API key as an egress secret: is one configured for this host?)"
		}
		return "", fmt.Errorf("the %s search answered %s%s: %s", t.cfg.Kind, resp.Status, hint, CleanText(string(body[:min(len(body), 300)])))
	}
	results, err := t.parse(body)
	if err != nil {
		return "", fmt.Errorf("the %s search answered something else than its JSON results: %w", t.cfg.Kind, err)
	}
	if len(results) > count {
		results = results[:count]
	}
	out, err := json.Marshal(struct {
		Results []SearchResult `json:"results"`
	}{Results: results})
	if err != nil {
		return "", fmt.Errorf("cannot encode the results: %w", err)
	}
	return string(out), nil
}

// endpoint is the provider's search URL for query under its base URL.
func (t webSearch) endpoint(query string, count int) (*url.URL, error) {
	base, err := url.Parse(t.cfg.BaseURL)
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" {
		return nil, fmt.Errorf("web_search is misconfigured: base URL %q is not an http(s) URL", t.cfg.BaseURL)
	}
	q := url.Values{"q": {query}}
	switch t.cfg.Kind {
	case SearchSearXNG:
		base = base.JoinPath("search")
		q.Set("format", "json")
	case SearchBrave:
		base = base.JoinPath("res/v1/web/search")
		q.Set("count", strconv.Itoa(count))
	default:
		return nil, fmt.Errorf("web_search is misconfigured: provider %q is not %s or %s", t.cfg.Kind, SearchSearXNG, SearchBrave)
	}
	base.RawQuery = q.Encode()
	return base, nil
}

func (t webSearch) parse(body []byte) ([]SearchResult, error) {
	type hit struct {
		Title       string `json:"title"`
		URL         string `json:"url"`
		Content     string `json:"content"`     // SearXNG
		Description string `json:"description"` // Brave
	}
	var hits []hit
	switch t.cfg.Kind {
	case SearchSearXNG:
		var r struct {
			Results *[]hit `json:"results"`
		}
		if err := json.Unmarshal(body, &r); err != nil {
			return nil, err
		}
		if r.Results == nil {
			return nil, errors.New("no results field")
		}
		hits = *r.Results
	case SearchBrave:
		var r struct {
			Type string `json:"type"`
			Web  *struct {
				Results []hit `json:"results"`
			} `json:"web"`
		}
		if err := json.Unmarshal(body, &r); err != nil {
			return nil, err
		}
		if r.Web == nil && r.Type != "search" {
			return nil, errors.New("no web results field")
		}
		if r.Web != nil {
			hits = r.Web.Results
		}
	}
	var out []SearchResult
	for _, h := range hits {
		u, err := url.Parse(h.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || len(h.URL) > searchURLLimit {
			continue
		}
		snippet := h.Content
		if snippet == "" {
			snippet = h.Description
		}
		out = append(out, SearchResult{Title: searchText(h.Title, searchTitleLimit), URL: CleanText(h.URL), Snippet: searchText(snippet, searchSnipLimit)})
	}
	return out, nil
}

// searchText is a title or snippet as plain text (providers mark matches
// up with HTML), at most limit characters.
func searchText(s string, limit int) string {
	s = strings.Join(strings.Fields(HTMLText(CleanText(s))), " ")
	if r := []rune(s); len(r) > limit {
		s = string(r[:limit]) + "…"
	}
	return s
}
