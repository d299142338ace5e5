package egress

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"

	"github.com/berth-dev/berth/internal/egresspolicy"
)

// What a provider answer is read for: its usage, as the bytes pass to the
// sandbox (docs/adr/0024-usage-and-budgets.md). Nothing is held back: the
// meter sees each piece after the sandbox got it, and keeps at most a
// window of it.
const (
	// usageHead is the start of a JSON answer (or an SSE data line) kept
	// whole: an answer that fits is decoded as it is.
	usageHead = 64 << 10
	// usageTail is the end of a longer one kept, where the providers put
	// their usage object.
	usageTail = 64 << 10
)

// wireUsage is a usage object in any of the documented shapes: OpenAI's
// chat completions (prompt_tokens, completion_tokens,
// prompt_tokens_details.cached_tokens), OpenAI's responses (input_tokens,
// output_tokens, input_tokens_details.cached_tokens) and Anthropic's
// messages (input_tokens, output_tokens, cache_read_input_tokens,
// cache_creation_input_tokens). A field that is absent stays nil, so a
// later event's usage (Anthropic's message_delta) adds to an earlier one's
// instead of zeroing it.
type wireUsage struct {
	PromptTokens        *int64         `json:"prompt_tokens"`
	CompletionTokens    *int64         `json:"completion_tokens"`
	PromptTokensDetails *cachedDetails `json:"prompt_tokens_details"`
	InputTokens         *int64         `json:"input_tokens"`
	OutputTokens        *int64         `json:"output_tokens"`
	InputTokensDetails  *cachedDetails `json:"input_tokens_details"`
	CacheRead           *int64         `json:"cache_read_input_tokens"`
	CacheCreation       *int64         `json:"cache_creation_input_tokens"`
}

type cachedDetails struct {
	CachedTokens *int64 `json:"cached_tokens"`
}

// usageEnvelope finds the usage object where each answer has it: at the
// top (a JSON answer, an OpenAI chunk, Anthropic's message_delta), in
// message (Anthropic's message_start) or in response (OpenAI's
// response.completed).
type usageEnvelope struct {
	Usage    *wireUsage                  `json:"usage"`
	Message  *struct{ Usage *wireUsage } `json:"message"`
	Response *struct{ Usage *wireUsage } `json:"response"`
}

func (e usageEnvelope) usage() *wireUsage {
	switch {
	case e.Usage != nil:
		return e.Usage
	case e.Message != nil && e.Message.Usage != nil:
		return e.Message.Usage
	case e.Response != nil && e.Response.Usage != nil:
		return e.Response.Usage
	}
	return nil
}

// merge takes every field o has.
func (u *wireUsage) merge(o *wireUsage) {
	pick := func(dst **int64, src *int64) {
		if src != nil {
			*dst = src
		}
	}
	pick(&u.PromptTokens, o.PromptTokens)
	pick(&u.CompletionTokens, o.CompletionTokens)
	pick(&u.InputTokens, o.InputTokens)
	pick(&u.OutputTokens, o.OutputTokens)
	pick(&u.CacheRead, o.CacheRead)
	pick(&u.CacheCreation, o.CacheCreation)
	if o.PromptTokensDetails != nil && o.PromptTokensDetails.CachedTokens != nil {
		u.PromptTokensDetails = o.PromptTokensDetails
	}
	if o.InputTokensDetails != nil && o.InputTokensDetails.CachedTokens != nil {
		u.InputTokensDetails = o.InputTokensDetails
	}
}

func val(p *int64) int64 {
	if p == nil {
		return 0
	}
	return max(*p, 0)
}

// tokens are u in berth's terms for a provider of kind: Input counts every
// prompt token, cached ones included.
func (u *wireUsage) tokens(kind string) egresspolicy.Tokens {
	if kind == "anthropic" {
		// Anthropic's input_tokens leaves out what the cache served and wrote.
		read := val(u.CacheRead)
		return egresspolicy.Tokens{Input: val(u.InputTokens) + read + val(u.CacheCreation), Output: val(u.OutputTokens), Cached: read}
	}
	if u.PromptTokens != nil || u.CompletionTokens != nil {
		t := egresspolicy.Tokens{Input: val(u.PromptTokens), Output: val(u.CompletionTokens)}
		if u.PromptTokensDetails != nil {
			t.Cached = val(u.PromptTokensDetails.CachedTokens)
		}
		return t
	}
	t := egresspolicy.Tokens{Input: val(u.InputTokens), Output: val(u.OutputTokens)}
	if u.InputTokensDetails != nil {
		t.Cached = val(u.InputTokensDetails.CachedTokens)
	}
	return t
}

// window keeps the start of a value whole and, past it, its end.
type window struct {
	head  []byte
	tail  []byte
	total int64
}

func (w *window) write(p []byte) {
	w.total += int64(len(p))
	if room := usageHead - len(w.head); room > 0 {
		n := min(room, len(p))
		w.head = append(w.head, p[:n]...)
		p = p[n:]
	}
	if len(p) == 0 {
		return
	}
	w.tail = append(w.tail, p...)
	if len(w.tail) > 2*usageTail {
		w.tail = append(w.tail[:0], w.tail[len(w.tail)-usageTail:]...)
	}
}

func (w *window) reset() { w.head, w.tail, w.total = w.head[:0], w.tail[:0], 0 }

var usageKey = []byte(`"usage"`)

// usage is the usage object of the value w saw, or nil. A value that fit
// is decoded whole; a longer one from the last "usage" key in its tail,
// which cannot sit inside a JSON string (quotes are escaped there).
func (w *window) usage() *wireUsage {
	if w.total <= usageHead {
		if !bytes.Contains(w.head, usageKey) {
			return nil
		}
		var e usageEnvelope
		if json.Unmarshal(w.head, &e) != nil {
			return nil
		}
		return e.usage()
	}
	tail := w.tail
	if len(tail) > usageTail {
		tail = tail[len(tail)-usageTail:]
	}
	i := bytes.LastIndex(tail, usageKey)
	if i < 0 {
		return nil
	}
	rest := bytes.TrimLeft(tail[i+len(usageKey):], " \t\r\n")
	if len(rest) == 0 || rest[0] != ':' {
		return nil
	}
	var u wireUsage
	if json.NewDecoder(bytes.NewReader(rest[1:])).Decode(&u) != nil {
		return nil
	}
	return &u
}

// usageMeter reads the usage of one provider answer: a JSON body, or
// server-sent events, line by line, each data line in a window.
type usageMeter struct {
	sse   bool
	body  window // the JSON body, or the current SSE line
	inSSE bool   // the current line is a data line
	start bool   // at the start of an SSE line
	got   wireUsage
	found bool
}

func newUsageMeter(contentType string) *usageMeter {
	return &usageMeter{sse: strings.HasPrefix(strings.ToLower(contentType), "text/event-stream"), start: true}
}

func (m *usageMeter) write(p []byte) {
	if !m.sse {
		m.body.write(p)
		return
	}
	for len(p) > 0 {
		if m.start {
			// Only data lines carry JSON; "data:" may be split across writes.
			m.start, m.inSSE = false, true
			m.body.reset()
		}
		i := bytes.IndexByte(p, '\n')
		line := p
		if i >= 0 {
			line = p[:i]
		}
		if m.inSSE {
			m.body.write(line)
			if m.body.total >= 5 && !bytes.HasPrefix(m.body.head, []byte("data:")) {
				m.inSSE = false
			}
		}
		if i < 0 {
			return
		}
		m.endLine()
		p = p[i+1:]
	}
}

func (m *usageMeter) endLine() {
	if m.inSSE && bytes.HasPrefix(m.body.head, []byte("data:")) {
		m.body.head = bytes.TrimRight(bytes.TrimSpace(m.body.head[5:]), "\r")
		if m.body.total <= usageHead {
			m.body.total = int64(len(m.body.head))
		}
		m.take(m.body.usage())
	}
	m.start = true
}

func (m *usageMeter) take(u *wireUsage) {
	if u != nil {
		m.got.merge(u)
		m.found = true
	}
}

// tokens are what the answer said it used; ok is false when it said
// nothing readable.
func (m *usageMeter) tokens(kind string) (egresspolicy.Tokens, bool) {
	if m.sse {
		if !m.start {
			m.endLine()
		}
	} else {
		m.take(m.body.usage())
	}
	if !m.found {
		return egresspolicy.Tokens{}, false
	}
	return m.got.tokens(kind), true
}

// meteredWriter passes a provider's answer to the sandbox and then to its
// meter, and keeps the status it was given.
type meteredWriter struct {
	http.ResponseWriter
	meter  *usageMeter
	status int
}

func (w *meteredWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
		w.meter = newUsageMeter(w.Header().Get("Content-Type"))
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *meteredWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	n, err := w.ResponseWriter.Write(p)
	// After the sandbox has the bytes: metering delays none of them.
	w.meter.write(p[:n])
	return n, err
}

func (w *meteredWriter) Flush() {
	if fl, ok := w.ResponseWriter.(http.Flusher); ok {
		fl.Flush()
	}
}

// price is what model of p costs, and whether the admin priced it.
func price(p *Provider, model string) (egresspolicy.Price, bool) {
	pr, ok := p.Prices[model]
	return pr, ok
}

// meteredCall sends a provider call and relays its answer, reading the
// usage as it passes, and reports the call with what it cost.
func (s *Server) meteredCall(w http.ResponseWriter, out *http.Request, d egresspolicy.Decision, p *Provider, endpoint string) {
	// The transport asks for gzip itself and unpacks it, so the meter
	// reads plain JSON; the sandbox's socket is local, size matters little.
	out.Header.Del("Accept-Encoding")
	start := s.opts.Clock.Now()
	mw := &meteredWriter{ResponseWriter: w, meter: newUsageMeter("")}
	s.roundTrip(mw, s.providers, out, d)
	c := egresspolicy.Call{Time: start.UTC(), Provider: p.Name, Model: p.Model, Endpoint: endpoint,
		Status: mw.status, Latency: s.opts.Clock.Since(start).Milliseconds()}
	if t, ok := mw.meter.tokens(p.Kind); ok {
		c.Tokens = t
	} else if c.Status < 400 && endpoint != "models" {
		c.UsageUnknown = true
	}
	if pr, ok := price(p, p.Model); ok {
		c.Priced, c.Cost = true, pr.Cost(c.Tokens)
	}
	s.reportCall(c)
}

// reportCall numbers c and hands it on (the scheduler, through
// berth-egress's stdout), or logs it.
func (s *Server) reportCall(c egresspolicy.Call) {
	c = s.allowance.reported(c)
	if s.opts.OnCall != nil {
		s.opts.OnCall(c)
		return
	}
	s.log.Info("provider call", "provider", c.Provider, "model", c.Model, "status", c.Status, "latency_ms", c.Latency,
		"input_tokens", c.Input, "output_tokens", c.Output, "cached_tokens", c.Cached, "cost", c.Cost, "budget", c.Budget)
}

// SetAllowance takes a newer allowance from the scheduler: the run's
// budget raised, or what other runs of the agent spent counted.
func (s *Server) SetAllowance(a egresspolicy.Allowance) { s.allowance.set(a) }
