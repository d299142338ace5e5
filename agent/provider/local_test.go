package provider

import (
	"context"
	"encoding/json"
	"testing"
)

func TestLocal(t *testing.T) {
	t.Parallel()
	shellTool := []Tool{{Name: "shell"}}
	shellCall := ToolCall{ID: "local-1", Name: "shell", Args: json.RawMessage(`{"command":"ls"}`)}

	tests := []struct {
		name      string
		system    string
		messages  []Message
		tools     []Tool
		wantText  string
		wantCalls []ToolCall
	}{
		{
			name:     "Plain_text_is_echoed_under_the_SOUL_name",
			system:   "\n# Ada\n\nYou keep records.",
			messages: []Message{{Role: RoleUser, Text: "hi"}},
			wantText: "Ada: you said: hi",
		},
		{
			name:      "A_shell_command_becomes_a_shell_call",
			messages:  []Message{{Role: RoleUser, Text: "/sh ls"}},
			tools:     shellTool,
			wantCalls: []ToolCall{shellCall},
		},
		{
			name:     "A_shell_command_without_the_shell_tool_is_refused",
			messages: []Message{{Role: RoleUser, Text: "/sh ls"}},
			wantText: `cannot run "ls": the shell tool is denied for this agent (tools allow/deny)`,
		},
		{
			name:      "A_tool_command_passes_raw_arguments",
			messages:  []Message{{Role: RoleUser, Text: "/tool read_file {bad"}},
			wantCalls: []ToolCall{{ID: "local-1", Name: "read_file", Args: json.RawMessage("{bad")}},
		},
		{
			name: "A_shell_result_is_reported_verbatim",
			messages: []Message{
				{Role: RoleUser, Text: "/sh ls"},
				{Role: RoleAssistant, ToolCalls: []ToolCall{shellCall}},
				{Role: RoleTool, ToolCallID: "local-1", ToolName: "shell", Text: `{"stdout":"a\n","stderr":"","exit_code":0}`},
			},
			wantText: "$ ls\na\n\n[stderr]\n\n[exit code 0]",
		},
		{
			name: "A_tool_error_is_reported",
			messages: []Message{
				{Role: RoleUser, Text: "/tool list_dir {}"},
				{Role: RoleAssistant, ToolCalls: []ToolCall{{ID: "local-1", Name: "list_dir"}}},
				{Role: RoleTool, ToolCallID: "local-1", ToolName: "list_dir", Text: "boom", IsError: true},
			},
			wantText: "[list_dir error]\nboom",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			turn, _, err := Local{}.Complete(context.Background(), Conversation{System: tc.system, Messages: tc.messages}, tc.tools)
			if err != nil {
				t.Fatal(err)
			}
			got, _ := json.Marshal(turn)
			want, _ := json.Marshal(Turn{Text: tc.wantText, ToolCalls: tc.wantCalls})
			if string(got) != string(want) {
				t.Errorf("turn = %s, want %s", got, want)
			}
		})
	}
}
