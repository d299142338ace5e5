package agent

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/berth-dev/berth/internal/agentproto"
)

func TestDeliverableCleansEveryTextOfTheResponse(t *testing.T) {
	t.Parallel()
	resp := deliverable(agentproto.Response{
		Reply: "re\x00ply\xff", Error: "er\x00ror",
		ToolCalls: []agentproto.ToolCall{
			{Name: "shell", Args: json.RawMessage(`{"command":"printf '\u0000'"}`), Output: "out\x00", Error: "\xfe"},
			{Name: "write_file", Args: json.RawMessage(`{"path":"x","content":"ok"}`)},
			{Name: "read_file", Args: json.RawMessage("{\"path\":\"\xff\"}")},
		},
	})
	data, err := json.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(data), `\u0000`) || !utf8.Valid(data) {
		t.Errorf("response still carries NUL or invalid UTF-8: %s", data)
	}
	var back agentproto.Response
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	if back.Reply != "re\uFFFDply\uFFFD" || back.Error != "er\uFFFDror" || back.ToolCalls[0].Output != "out\uFFFD" {
		t.Errorf("cleaned response = %+v", back)
	}
	var args struct{ Command string }
	if err := json.Unmarshal(back.ToolCalls[0].Args, &args); err != nil || args.Command != "printf '\uFFFD'" {
		t.Errorf("args = %s (%v), want the NUL replaced", back.ToolCalls[0].Args, err)
	}
	if string(back.ToolCalls[1].Args) != `{"path":"x","content":"ok"}` {
		t.Errorf("clean args changed: %s", back.ToolCalls[1].Args)
	}
}
