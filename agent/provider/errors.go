package provider

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Class says what the agent does about a failed call.
type Class int

const (
	// Fatal errors end the run: bad key, unknown model, malformed request.
	Fatal Class = iota
	// Transient errors are retried with back-off and then fall through to
	// the next provider: connection errors, 408, 409, 429 and 5xx.
	Transient
	// ContextOverflow means the conversation does not fit the model's
	// context window: the history is compacted and the call retried once.
	ContextOverflow
)

func (c Class) String() string {
	switch c {
	case Transient:
		return "transient"
	case ContextOverflow:
		return "context overflow"
	}
	return "fatal"
}

// Error is a failed call to a model API, described without secrets.
type Error struct {
	Class Class
	// Status is the HTTP status, 0 for connection errors.
	Status int
	// RetryAfter is what the server asked for (Retry-After, retry-after-ms), or 0.
	RetryAfter time.Duration
	Msg        string
	// RefusedByEgress says the answer is the egress proxy's own, not the
	// provider's: it refused the call or could not reach the provider.
	RefusedByEgress bool
}

// EgressRefusedHeader is the header berth's egress proxy marks its own
// refusals with ("refused"), so a 502 of the proxy is told from the API's.
const EgressRefusedHeader = "X-Berth-Egress"

func (e *Error) Error() string {
	if e.Status == 0 {
		return e.Msg
	}
	if text := http.StatusText(e.Status); text != "" {
		return fmt.Sprintf("HTTP %d %s: %s", e.Status, text, e.Msg)
	}
	return fmt.Sprintf("HTTP %d: %s", e.Status, e.Msg) // e.g. Anthropic's 529
}

// ErrorClass returns the class of err: an *Error's own class; context
// cancellation and unknown errors are fatal.
func ErrorClass(err error) Class {
	var pe *Error
	if errors.As(err, &pe) {
		return pe.Class
	}
	return Fatal
}

// classifyStatus maps an HTTP error answer to a class. message is the
// provider's error text; overflow is recognised by what OpenAI, Anthropic,
// vLLM, llama.cpp and Ollama say.
func classifyStatus(status int, code, message string) Class {
	switch {
	case status == http.StatusRequestEntityTooLarge:
		return ContextOverflow
	case (status == http.StatusBadRequest || status == http.StatusUnprocessableEntity) &&
		(isOverflowText(code) || isOverflowText(message)):
		return ContextOverflow
	case status == http.StatusRequestTimeout, status == http.StatusConflict,
		status == http.StatusTooManyRequests, status >= 500:
		return Transient
	}
	return Fatal
}

var overflowMarkers = []string{
	"context_length_exceeded",
	"maximum context length",
	"context length",
	"context window",
	"context size",
	"prompt is too long",
	"too many tokens",
	"exceed_context_size",
}

func isOverflowText(s string) bool {
	s = strings.ToLower(s)
	for _, m := range overflowMarkers {
		if strings.Contains(s, m) {
			return true
		}
	}
	return false
}

// connectionError wraps a failure to get any HTTP answer. Cancellation of
// the run is not a provider failure and stays fatal.
func connectionError(err error, redact func(string) string) error {
	if errors.Is(err, context.Canceled) {
		return err
	}
	return &Error{Class: Transient, Msg: redact("cannot reach the API: " + err.Error())}
}

// retryAfter reads retry-after-ms (OpenAI) or Retry-After (seconds or an
// HTTP date).
func retryAfter(h http.Header, now time.Time) time.Duration {
	if h == nil {
		return 0
	}
	if ms, err := strconv.ParseFloat(h.Get("Retry-After-Ms"), 64); err == nil && ms > 0 {
		return time.Duration(ms * float64(time.Millisecond))
	}
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil && s > 0 {
		return time.Duration(s * float64(time.Second))
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

// redactor replaces the key wherever an error message might echo it.
func redactor(key string) func(string) string {
	return func(s string) string {
		if len(key) < 4 {
			return s
		}
		return strings.ReplaceAll(s, key, "[redacted]")
	}
}

// truncate keeps error texts from servers short.
func truncate(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
