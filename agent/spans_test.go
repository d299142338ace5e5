package agent_test

import (
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/agentproto"
)

// berth-agent reports its loop, each model call and each tool call as span
// records in its response: parents, order and times right, failures
// marked, and nothing of the conversation in them.
func TestTheResponseCarriesTheLoopsSpansWithoutTheConversation(t *testing.T) {
	t.Parallel()
	requireLandlock(t, 1)
	const secretText = "the-users-private-words"
	model := newFakeOpenAI(t, func(r oaRequest) (int, string) {
		if role, _ := r.last(); role == "tool" {
			return oaText("done")
		}
		return oaCall("call_1", "no_such_tool", map[string]string{"command": "echo " + secretText})
	})
	f := newFixture(t)
	res := runAgent(t, f.openAIRequest(model, "please run "+secretText))
	res.expect(t, agentproto.ExitOK, "done")

	spans := res.resp.Spans
	var names []string
	for _, s := range spans {
		names = append(names, s.Name)
	}
	want := []string{agentproto.SpanLoop, agentproto.SpanLLM, agentproto.SpanTool, agentproto.SpanLLM}
	if strings.Join(names, ",") != strings.Join(want, ",") || res.resp.SpansDropped != 0 {
		t.Fatalf("spans %v (dropped %d), want %v", names, res.resp.SpansDropped, want)
	}
	loop, llm1, tool, llm2 := spans[0], spans[1], spans[2], spans[3]
	if loop.Parent != -1 || llm1.Parent != 0 || tool.Parent != 0 || llm2.Parent != 0 {
		t.Errorf("parents %d %d %d %d, want -1 0 0 0", loop.Parent, llm1.Parent, tool.Parent, llm2.Parent)
	}
	for i, s := range spans {
		if s.End.Before(s.Start) || s.Start.Before(loop.Start) || s.End.After(loop.End) {
			t.Errorf("span %d %s: %v to %v, outside the loop's %v to %v", i, s.Name, s.Start, s.End, loop.Start, loop.End)
		}
	}
	if llm1.End.After(tool.Start) || tool.End.After(llm2.Start) || !loop.End.Equal(llm2.End) {
		t.Errorf("calls overlap or the loop ends before its last call: %+v", spans)
	}
	if tool.Error != "tool call failed" || tool.Attributes["berth.tool"] != "no_such_tool" || llm1.Error != "" {
		t.Errorf("tool span %+v, model span %+v; want the failed call marked, the model call not", tool, llm1)
	}
	if llm1.Attributes["gen_ai.usage.input_tokens"] != "3" || llm1.Attributes["gen_ai.request.model"] != "gpt-test" {
		t.Errorf("model span attributes %v", llm1.Attributes)
	}
	for _, s := range spans {
		for k, v := range s.Attributes {
			if strings.Contains(k+v+s.Error, secretText) || strings.Contains(k+v+s.Error, providerKey) {
				t.Errorf("span %s carries the conversation or the key: %s=%s %s", s.Name, k, v, s.Error)
			}
		}
	}
}
