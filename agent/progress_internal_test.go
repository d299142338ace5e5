package agent

import (
	"bufio"
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/agentproto"
)

func TestProgressText_shows_the_program_and_host_never_the_arguments(t *testing.T) {
	t.Parallel()
	const secret = "sk-live-0123456789abcdef"
	cases := []struct {
		name, tool, args, want string
	}{
		{"Program_alone", "shell", `{"command":"pytest -q tests/"}`, "running `pytest`"},
		{"Program_and_subcommand", "shell", `{"command":"go test ./..."}`, "running `go test`"},
		{"Assignments_before_the_program_are_skipped", "shell", `{"command":"TOKEN=` + secret + ` curl https://x.example"}`, "running `curl`"},
		{"A_token_as_second_word_is_left_out", "shell", `{"command":"deploy ` + secret + `"}`, "running `deploy`"},
		{"A_path_as_program_shows_its_name", "shell", `{"command":"/usr/bin/make all"}`, "running `make all`"},
		{"A_program_that_is_not_a_name", "shell", `{"command":"$(echo ` + secret + `)"}`, "running a command"},
		{"Fetch_shows_the_host_only", "web_fetch", `{"url":"https://PyPI.org/simple/?token=` + secret + `"}`, "fetching pypi.org"},
		{"Fetch_of_no_URL", "web_fetch", `{"url":"::"}`, "fetching a page"},
		{"Search_hides_the_query", "web_search", `{"query":"` + secret + `"}`, "searching the web"},
		{"Unknown_tool_by_name", "mcp_github_issues", `{"q":"` + secret + `"}`, "using mcp_github_issues"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := progressText(tc.tool, json.RawMessage(tc.args))
			if got != tc.want {
				t.Errorf("progressText(%s, %s) = %q, want %q", tc.tool, tc.args, got, tc.want)
			}
			if strings.Contains(got, secret) {
				t.Errorf("the summary %q shows the secret", got)
			}
		})
	}
}

func TestProgressReporter_writes_capped_log_lines_the_supervisor_reads(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	p := newProgressReporter(newLogger(&buf))
	long := strings.Repeat("é", 200) // a tool name of 400 bytes
	for range agentproto.MaxProgressEvents + 10 {
		p.toolStarted(long, json.RawMessage(`{}`))
	}
	p.toolStarted("shell", json.RawMessage(`{"command":"ls"}`)) // past the cap: not written

	var lines int
	sc := bufio.NewScanner(&buf)
	for sc.Scan() {
		var line struct {
			Msg      string              `json:"msg"`
			Progress agentproto.Progress `json:"progress"`
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("line %d is not JSON: %v", lines+1, err)
		}
		lines++
		if line.Msg != agentproto.LogProgress || line.Progress.Seq != lines {
			t.Fatalf("line %d = msg %q seq %d, want %q seq %d", lines, line.Msg, line.Progress.Seq, agentproto.LogProgress, lines)
		}
		if len(line.Progress.Text) > agentproto.MaxProgressText || len(line.Progress.Tool) > 64 {
			t.Fatalf("line %d is over the caps: text %d bytes, tool %d bytes", lines, len(line.Progress.Text), len(line.Progress.Tool))
		}
		if len(sc.Bytes()) > agentproto.MaxProgressLine {
			t.Fatalf("line %d is %d bytes, over MaxProgressLine", lines, len(sc.Bytes()))
		}
	}
	if lines != agentproto.MaxProgressEvents {
		t.Fatalf("%d progress lines, want the cap %d", lines, agentproto.MaxProgressEvents)
	}
}
