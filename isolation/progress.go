package isolation

// Progress (docs/adr/0027-live-progress.md): berth-agent reports the tool
// calls it starts as agentproto.LogProgress lines in its log on stderr.
// Supervise and a kept sandbox's Run pick them out of the stream as the
// backend copies it and hand each to the callback WithProgress put in the
// run's context, held to the protocol's caps whatever the agent wrote: lines
// longer than agentproto.MaxProgressLine are not parsed, at most
// agentproto.MaxProgressEvents are passed on, in increasing Seq, and every
// text is valid UTF-8 without control characters, with the run's known
// secrets redacted before it is cut to agentproto.MaxProgressText.

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"strings"
	"sync"
	"unicode"

	"github.com/berth-dev/berth/internal/agentproto"
)

type progressKey struct{}

// WithProgress returns ctx carrying fn: a run started with it hands fn each
// progress event its agent reports, as the event arrives, on the goroutine
// copying the agent's stderr. fn must not block.
func WithProgress(ctx context.Context, fn func(agentproto.Progress)) context.Context {
	return context.WithValue(ctx, progressKey{}, fn)
}

func progressOf(ctx context.Context) func(agentproto.Progress) {
	fn, _ := ctx.Value(progressKey{}).(func(agentproto.Progress))
	return fn
}

// maxProgressTool caps a tool name passed on.
const maxProgressTool = 64

// progressMarker is how a progress line's message appears in the agent's
// JSON log line.
var progressMarker = []byte(`"msg":"` + agentproto.LogProgress + `"`)

// progressLines finds progress lines in an agent's stderr.
type progressLines struct {
	fn      func(agentproto.Progress)
	secrets []string

	mu      sync.Mutex
	partial []byte
	over    bool // the line being read is longer than MaxProgressLine
	events  int
	lastSeq int
}

// newProgressLines is nil when ctx carries no progress callback.
func newProgressLines(ctx context.Context, spec Spec) *progressLines {
	fn := progressOf(ctx)
	if fn == nil {
		return nil
	}
	return &progressLines{fn: fn, secrets: knownSecrets(spec)}
}

// withProgress is stderr, also read for progress when ctx asks for it.
func withProgress(ctx context.Context, spec Spec, stderr io.Writer) io.Writer {
	if p := newProgressLines(ctx, spec); p != nil {
		return io.MultiWriter(stderr, p)
	}
	return stderr
}

func (p *progressLines) Write(b []byte) (int, error) {
	var found []agentproto.Progress
	p.mu.Lock()
	for rest := b; len(rest) > 0; {
		i := bytes.IndexByte(rest, '\n')
		chunk := rest
		if i >= 0 {
			chunk = rest[:i]
		}
		if !p.over {
			if len(p.partial)+len(chunk) > agentproto.MaxProgressLine {
				p.over, p.partial = true, p.partial[:0]
			} else {
				p.partial = append(p.partial, chunk...)
			}
		}
		if i < 0 {
			break
		}
		if !p.over && p.events < agentproto.MaxProgressEvents {
			if ev, ok := p.parse(p.partial); ok {
				p.events++
				found = append(found, ev)
			}
		}
		p.partial, p.over = p.partial[:0], false
		rest = rest[i+1:]
	}
	p.mu.Unlock()
	for _, ev := range found {
		p.fn(ev)
	}
	return len(b), nil
}

// parse reads line as a progress event of this run, cleaned.
func (p *progressLines) parse(line []byte) (agentproto.Progress, bool) {
	if !bytes.Contains(line, progressMarker) {
		return agentproto.Progress{}, false
	}
	var l struct {
		Msg      string               `json:"msg"`
		Progress *agentproto.Progress `json:"progress"`
	}
	if json.Unmarshal(line, &l) != nil || l.Msg != agentproto.LogProgress || l.Progress == nil {
		return agentproto.Progress{}, false
	}
	ev := *l.Progress
	if ev.Seq <= p.lastSeq || ev.Seq > agentproto.MaxProgressEvents {
		return agentproto.Progress{}, false
	}
	p.lastSeq = ev.Seq
	ev.Tool = cutText(redactText(cleanProgressText(ev.Tool), p.secrets), maxProgressTool)
	ev.Text = cutText(redactText(cleanProgressText(ev.Text), p.secrets), agentproto.MaxProgressText)
	if ev.Text == "" {
		return agentproto.Progress{}, false
	}
	return ev, true
}

// cleanProgressText is s as valid UTF-8 on one line: control and format
// characters (newlines, bidi overrides) become spaces.
func cleanProgressText(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) || unicode.Is(unicode.Cf, r) {
			return ' '
		}
		return r
	}, s)
	return strings.TrimSpace(s)
}

func redactText(s string, secrets []string) string {
	for _, secret := range secrets {
		s = strings.ReplaceAll(s, secret, Redacted)
	}
	return s
}

// cutText cuts s to at most n bytes on a character boundary.
func cutText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && s[cut]&0xC0 == 0x80 {
		cut--
	}
	return s[:cut]
}

// setProgress makes a kept sandbox's stderr also go to p (nil: no more).
func (o *KeptOutput) setProgress(p *progressLines) {
	o.mu.Lock()
	o.progress = p
	o.mu.Unlock()
}
