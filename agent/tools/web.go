package tools

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/berth-dev/berth/agent/provider"
)

// web_fetch limits.
const (
	WebFetchTimeout   = 20 * time.Second
	WebFetchMaxBody   = 2 << 20  // bytes read from the server
	WebFetchMaxText   = 64 << 10 // bytes of text returned
	webFetchRedirects = 5
)

type webFetch struct{ env Env }

func (webFetch) Spec() provider.Tool {
	return provider.Tool{
		Name: "web_fetch",
		Description: "Fetch an http(s) URL with GET and return its status and text (HTML is reduced to text). " +
			"At most 64 KiB of text; 20 s timeout. Only works when the agent may use the network or its egress proxy allows the host.",
		Parameters: schema(`{"type":"object","properties":{"url":{"type":"string"}},"required":["url"],"additionalProperties":false}`),
	}
}

func (t webFetch) Call(ctx context.Context, raw json.RawMessage) (string, error) {
	var args struct {
		URL string `json:"url"`
	}
	if err := decodeArgs(raw, &args); err != nil {
		return "", err
	}
	u, err := url.Parse(strings.TrimSpace(args.URL))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("bad arguments: %q is not an http(s) URL", args.URL)
	}
	if !t.env.Network {
		return "", errors.New("this agent has no network access (file_access.allow_network is false)")
	}
	ctx, cancel := context.WithTimeout(ctx, WebFetchTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return "", fmt.Errorf("cannot build request: %w", err)
	}
	req.Header.Set("User-Agent", "berth-agent web_fetch")
	req.Header.Set("Accept", "text/html, text/plain, application/json, */*;q=0.5")
	transport, err := t.env.webTransport()
	if err != nil {
		return "", err
	}
	client := &http.Client{Transport: transport, CheckRedirect: func(r *http.Request, via []*http.Request) error {
		if len(via) >= webFetchRedirects {
			return fmt.Errorf("more than %d redirects", webFetchRedirects)
		}
		if r.URL.Scheme != "http" && r.URL.Scheme != "https" {
			return fmt.Errorf("redirect to a %s URL", r.URL.Scheme)
		}
		return nil
	}}
	resp, err := client.Do(req)
	if err != nil {
		return "", fmt.Errorf("cannot fetch %s: %w", u.Redacted(), err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, WebFetchMaxBody))
	if err != nil {
		return "", fmt.Errorf("cannot read %s: %w", u.Redacted(), err)
	}
	ctype := resp.Header.Get("Content-Type")
	text := string(body)
	if strings.Contains(ctype, "html") || (ctype == "" && looksLikeHTML(text)) {
		text = HTMLText(text)
	}
	out := &capped{limit: WebFetchMaxText}
	fmt.Fprintf(out, "HTTP %s\ncontent-type: %s\n\n", resp.Status, ctype)
	out.Write([]byte(text))
	return out.String(), nil
}

// The page-to-text expressions, compiled at first use: berth-agent starts
// once per run, and most runs fetch no page.
var (
	htmlDrop = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(`(?is)<(script|style|noscript|template|svg|head)\b.*?</(script|style|noscript|template|svg|head)\s*>|<!--.*?-->`)
	})
	htmlBreak = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(`(?i)<(br|/p|/div|/li|/tr|/h[1-6]|/title|/pre|/blockquote|/section|/article|hr)\b[^>]*>`)
	})
	htmlTag   = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`(?s)<[^>]*>`) })
	blankRuns = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`\n\s*\n\s*\n+`) })
	spaceRuns = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`[ \t\r\f\v]+`) })
)

// HTMLText reduces an HTML page to readable text: scripts, styles and
// comments dropped, block ends turned into line breaks, tags removed,
// entities decoded, blank runs collapsed.
func HTMLText(page string) string {
	s := htmlDrop().ReplaceAllString(page, " ")
	s = htmlBreak().ReplaceAllString(s, "\n")
	s = htmlTag().ReplaceAllString(s, " ")
	s = html.UnescapeString(s)
	s = spaceRuns().ReplaceAllString(s, " ")
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimSpace(l)
	}
	s = strings.Join(lines, "\n")
	s = blankRuns().ReplaceAllString(s, "\n\n")
	return strings.TrimSpace(s)
}

func looksLikeHTML(s string) bool {
	head := strings.ToLower(s[:min(len(s), 512)])
	return strings.Contains(head, "<html") || strings.Contains(head, "<!doctype html")
}

// webTransport is web_fetch's transport: straight out with a direct
// network, or through the run's egress proxy (trusting the run's CA bundle
// when it has one, for the hosts the proxy adds credentials to).
func (e Env) webTransport() (*http.Transport, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if e.ProxyURL == "" {
		return tr, nil
	}
	proxy, err := url.Parse(e.ProxyURL)
	if err != nil {
		return nil, fmt.Errorf("bad egress proxy URL %q: %w", e.ProxyURL, err)
	}
	tr.Proxy = http.ProxyURL(proxy)
	if e.CABundle != "" {
		pem, err := os.ReadFile(e.CABundle)
		if err != nil {
			return nil, fmt.Errorf("cannot read the run's CA bundle: %w", err)
		}
		roots := x509.NewCertPool()
		if !roots.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("the run's CA bundle %s holds no certificate", e.CABundle)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: roots}
	}
	return tr, nil
}
