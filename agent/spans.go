package agent

import (
	"strconv"
	"time"

	"github.com/berth-dev/berth/agent/provider"
	"github.com/berth-dev/berth/internal/agentproto"
)

// spanLog keeps the run's span records in its response as the loop goes
// (docs/adr/0025-traces.md), so that every way out of the loop — an answer,
// a failure, the iteration limit — answers with them. The loop's own span
// ends with the last call that ended. Records carry names, times, token
// counts and a tool's name, never arguments, outputs or message text.
type spanLog struct {
	resp *agentproto.Response
	loop int
}

// startSpans starts the loop's span in resp.
func startSpans(resp *agentproto.Response, req agentproto.Request) *spanLog {
	l := &spanLog{resp: resp, loop: -1}
	l.loop = l.start(agentproto.SpanLoop, -1, map[string]string{"berth.agent": req.Agent.ID})
	return l
}

// start adds a record begun now and returns its index, -1 when the cap
// left it out.
func (l *spanLog) start(name string, parent int, attrs map[string]string) int {
	if len(l.resp.Spans) >= agentproto.MaxSpans {
		l.resp.SpansDropped++
		return -1
	}
	now := time.Now()
	l.resp.Spans = append(l.resp.Spans, agentproto.SpanRecord{Name: name, Parent: parent, Start: now, End: now, Attributes: attrs})
	return len(l.resp.Spans) - 1
}

// end ends record i now, failed with errText when it is set.
func (l *spanLog) end(i int, errText string, attrs map[string]string) {
	if i < 0 {
		return
	}
	now := time.Now()
	rec := &l.resp.Spans[i]
	rec.End = now
	rec.Error = cutText(errText, agentproto.MaxSpanText)
	for k, v := range attrs {
		if len(rec.Attributes) < agentproto.MaxSpanAttributes {
			rec.Attributes[k] = v
		}
	}
	if l.loop >= 0 {
		l.resp.Spans[l.loop].End = now
	}
}

// llm starts the span of model call number iteration.
func (l *spanLog) llm(iteration int, p agentproto.Provider) int {
	return l.start(agentproto.SpanLLM, l.loop, map[string]string{
		"berth.iteration":      strconv.Itoa(iteration),
		"gen_ai.provider.name": cutText(p.Name, agentproto.MaxSpanText),
		"gen_ai.request.model": cutText(p.Model, agentproto.MaxSpanText),
	})
}

// llmDone ends a model call's span with what it used.
func (l *spanLog) llmDone(i int, usage provider.Usage, err error) {
	errText := ""
	if err != nil {
		errText = "model call failed: " + err.Error()
	}
	l.end(i, errText, map[string]string{
		"gen_ai.usage.input_tokens":  strconv.Itoa(usage.InputTokens),
		"gen_ai.usage.output_tokens": strconv.Itoa(usage.OutputTokens),
	})
}

// tool starts the span of a call of the tool name.
func (l *spanLog) tool(name string) int {
	return l.start(agentproto.SpanTool, l.loop, map[string]string{"berth.tool": cutText(name, agentproto.MaxSpanText)})
}

// toolDone ends a tool call's span. A failed call says only that it
// failed: a tool's error may quote what it read.
func (l *spanLog) toolDone(i int, err error) {
	errText := ""
	if err != nil {
		errText = "tool call failed"
	}
	l.end(i, errText, nil)
}

// cutText is s cut to at most n bytes, at a rune boundary.
func cutText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

func utf8RuneStart(b byte) bool { return b&0xC0 != 0x80 }
