package agent_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testkit/testenv"

	"github.com/berth-dev/berth/agent/confine"
	"github.com/berth-dev/berth/internal/agentproto"
)

// agentBinary is berth-agent built once, statically, for all tests;
// probeBinary is testdata/probe, what a hostile tool runs. Both live in
// testDir, which every user may enter.
var agentBinary, probeBinary, testDir string

func TestMain(m *testing.M) {
	dir, err := testenv.OpenDir("berth-agent-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	testDir = dir
	if probeBinary, err = testenv.Build(dir, "probe", "./testdata/probe"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	agentBinary = filepath.Join(dir, "berth-agent")
	build := exec.Command("go", "build", "-o", agentBinary, "github.com/berth-dev/berth/cmd/berth-agent")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "cannot build berth-agent:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// requireLandlock skips where the kernel has no Landlock, except in CI where
// a missing Landlock fails the test.
func requireLandlock(t *testing.T, minABI int) {
	t.Helper()
	if abi := confine.KernelABI(); abi < minABI {
		testenv.Need(t, false, "kernel Landlock ABI is %d, these tests need %d", abi, minABI)
	}
}

// fixture is a host layout with two agents' workspaces and a fake berth
// config outside both.
type fixture struct {
	root      string
	workspace string
	sibling   string // another agent's workspace
	config    string // world-readable file outside the policy
}

func newFixture(t *testing.T) fixture {
	t.Helper()
	root, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	f := fixture{
		root:      root,
		workspace: filepath.Join(root, "agents", "alpha"),
		sibling:   filepath.Join(root, "agents", "beta"),
		config:    filepath.Join(root, "etc-berth", "berth.toml"),
	}
	writeFile(t, filepath.Join(f.sibling, "secret.txt"), "beta's secret\n")
	writeFile(t, f.config, "[providers]\nkey = \"config-secret\"\n")
	if err := os.MkdirAll(f.workspace, 0o755); err != nil {
		t.Fatal(err)
	}
	return f
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// systemPolicy is the smallest policy under which /bin/sh, coreutils and
// bash run: the system's read set plus the workspace.
func systemPolicy(workspace string) agentproto.Policy {
	return agentproto.Policy{
		AllowRead:      []string{"/usr", "/bin", "/lib", "/lib64", "/etc/ld.so.cache"},
		AllowReadWrite: []string{workspace, "/dev/null"},
	}
}

func (f fixture) request(text string) agentproto.Request {
	return agentproto.Request{
		Version: agentproto.Version,
		RunID:   "run-1",
		Agent:   agentproto.Agent{ID: "alpha", Name: "Alpha", MaxIterations: 5},
		Message: agentproto.Message{ID: "m-1", Connector: "test", Channel: "c", Author: "u", Text: text,
			ReceivedAt: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)},
		Provider:  agentproto.Provider{Name: "offline", Kind: "local", Key: "sk-provider-key-do-not-leak"},
		Policy:    systemPolicy(f.workspace),
		Workspace: f.workspace,
	}
}

type result struct {
	code           int
	stdout, stderr string
	resp           agentproto.Response
}

func runAgent(t *testing.T, req any, env ...string) result {
	t.Helper()
	var stdin []byte
	switch r := req.(type) {
	case []byte:
		stdin = r
	default:
		var err error
		if stdin, err = json.Marshal(r); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(agentBinary)
	cmd.Env = append([]string{"PATH=/usr/bin:/bin"}, env...)
	cmd.Stdin = bytes.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	res := result{stdout: stdout.String(), stderr: stderr.String()}
	if exitErr, ok := err.(*exec.ExitError); ok {
		res.code = exitErr.ExitCode()
	} else if err != nil {
		t.Fatalf("cannot run berth-agent: %v", err)
	}
	if res.stdout != "" {
		if err := json.Unmarshal(stdout.Bytes(), &res.resp); err != nil {
			t.Fatalf("stdout is not a response: %v\n%s", err, res.stdout)
		}
	}
	if strings.Contains(res.stdout+res.stderr, "sk-provider-key-do-not-leak") {
		t.Errorf("the provider key leaked into stdout or stderr:\n%s\n%s", res.stdout, res.stderr)
	}
	return res
}

func (r result) expect(t *testing.T, code int, replyHas ...string) {
	t.Helper()
	if r.code != code {
		t.Fatalf("exit code = %d, want %d\nstdout: %s\nstderr: %s", r.code, code, r.stdout, r.stderr)
	}
	for _, s := range replyHas {
		if !strings.Contains(r.resp.Reply, s) {
			t.Errorf("reply lacks %q:\n%s\nstderr: %s", s, r.resp.Reply, r.stderr)
		}
	}
}

func TestConfinementKeepsTheAgentInsideItsPolicy(t *testing.T) {
	t.Parallel()
	requireLandlock(t, confine.MinNetworkABI)
	if os.Geteuid() != 0 {
		t.Log("not root: denials below would hold without Landlock too for /etc/shadow")
	}

	tests := []struct {
		name     string
		command  func(f fixture) string
		policy   func(f fixture, p *agentproto.Policy)
		replyHas func(f fixture) []string
		after    func(t *testing.T, f fixture)
	}{
		{
			name:     "A_world_readable_file_outside_the_policy_is_readable_when_unrestricted",
			command:  func(f fixture) string { return "cat " + f.config },
			policy:   func(f fixture, p *agentproto.Policy) { *p = agentproto.Policy{Unrestricted: true, Network: true} },
			replyHas: func(fixture) []string { return []string{"config-secret", "[exit code 0]"} },
		},
		{
			name:     "A_world_readable_file_outside_the_policy_is_unreadable_when_confined",
			command:  func(f fixture) string { return "cat " + f.config },
			replyHas: func(f fixture) []string { return []string{"cat: " + f.config + ": Permission denied", "[exit code 1]"} },
		},
		{
			name:     "The_workspace_is_writable",
			command:  func(fixture) string { return "echo written > note.txt && cat note.txt && mktemp" },
			replyHas: func(f fixture) []string { return []string{"written\n" + f.workspace + "/.tmp/tmp.", "[exit code 0]"} },
			after: func(t *testing.T, f fixture) {
				if data, err := os.ReadFile(filepath.Join(f.workspace, "note.txt")); err != nil || string(data) != "written\n" {
					t.Errorf("note.txt = %q, %v; want written", data, err)
				}
			},
		},
		{
			name:     "Writing_outside_the_allowed_paths_fails",
			command:  func(f fixture) string { return "echo x > " + f.root + "/escaped.txt" },
			replyHas: func(f fixture) []string { return []string{f.root + "/escaped.txt: Permission denied", "[exit code 2]"} },
			after: func(t *testing.T, f fixture) {
				if _, err := os.Stat(filepath.Join(f.root, "escaped.txt")); err == nil {
					t.Error("the agent created a file outside its policy")
				}
			},
		},
		{
			name:    "Another_agents_workspace_is_unreadable",
			command: func(f fixture) string { return "cat " + f.sibling + "/secret.txt; ls " + f.sibling },
			replyHas: func(f fixture) []string {
				return []string{"secret.txt: Permission denied", "cannot open directory", "[exit code 2]"}
			},
		},
		{
			name:     "Etc_shadow_is_unreadable_even_to_root",
			command:  func(fixture) string { return "cat /etc/shadow" },
			replyHas: func(fixture) []string { return []string{"cat: /etc/shadow: Permission denied", "[exit code 1]"} },
		},
		{
			name: "Deny_beats_allow_read",
			command: func(f fixture) string {
				return "cat " + f.root + "/shared/public.txt " + f.root + "/shared/private.txt"
			},
			policy: func(f fixture, p *agentproto.Policy) {
				p.AllowRead = append(p.AllowRead, f.root+"/shared")
				p.Deny = []string{f.root + "/shared/private.txt"}
			},
			replyHas: func(f fixture) []string {
				return []string{"public\n", "private.txt: Permission denied", "[exit code 1]"}
			},
		},
		{
			name: "Deny_beats_allow_read_write",
			command: func(f fixture) string {
				return "echo more >> " + f.root + "/shared/public.txt && cat " + f.root + "/shared/private.txt"
			},
			policy: func(f fixture, p *agentproto.Policy) {
				p.AllowReadWrite = append(p.AllowReadWrite, f.root+"/shared")
				p.Deny = []string{f.root + "/shared/private.txt"}
			},
			replyHas: func(f fixture) []string { return []string{"private.txt: Permission denied", "[exit code 1]"} },
			after: func(t *testing.T, f fixture) {
				if data, _ := os.ReadFile(filepath.Join(f.root, "shared/public.txt")); string(data) != "public\nmore\n" {
					t.Errorf("public.txt = %q, want the agent's append", data)
				}
			},
		},
		{
			name: "A_denied_path_that_does_not_exist_yet_stays_denied",
			command: func(f fixture) string {
				return "echo planted > " + f.root + "/shared/later.txt; cat " + f.root + "/shared/later.txt"
			},
			policy: func(f fixture, p *agentproto.Policy) {
				p.AllowReadWrite = append(p.AllowReadWrite, f.root+"/shared")
				p.Deny = []string{f.root + "/shared/later.txt"}
			},
			replyHas: func(f fixture) []string { return []string{"later.txt: Permission denied"} },
			after: func(t *testing.T, f fixture) {
				if _, err := os.Stat(filepath.Join(f.root, "shared/later.txt")); err == nil {
					t.Error("the agent created a path it is denied")
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			writeFile(t, filepath.Join(f.root, "shared/public.txt"), "public\n")
			writeFile(t, filepath.Join(f.root, "shared/private.txt"), "private\n")
			req := f.request("/sh " + tc.command(f))
			if tc.policy != nil {
				tc.policy(f, &req.Policy)
			}
			res := runAgent(t, req)
			res.expect(t, agentproto.ExitOK, tc.replyHas(f)...)
			if tc.after != nil {
				tc.after(t, f)
			}
		})
	}
}

func TestConfinementFailsClosed(t *testing.T) {
	t.Parallel()
	requireLandlock(t, confine.MinNetworkABI)

	tests := []struct {
		name      string
		abi       string
		network   bool
		wantCode  int
		stderrHas string
	}{
		{"No_Landlock_refuses_to_run", "0", true, agentproto.ExitConfinement, "kernel has no Landlock (ABI 0); refusing to run unconfined"},
		{"ABI_3_refuses_to_run_without_network", "3", false, agentproto.ExitConfinement, "cannot restrict TCP (needs ABI 4)"},
		{"An_unreadable_ABI_cap_refuses_to_run", "three", false, agentproto.ExitConfinement, "BERTH_TEST_LANDLOCK_ABI"},
		{"ABI_3_runs_when_network_is_allowed", "3", true, agentproto.ExitOK, ""},
		{"A_cap_above_the_kernel_changes_nothing", "99", false, agentproto.ExitOK, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			marker := filepath.Join(f.workspace, "ran")
			req := f.request("/sh touch " + marker)
			req.Policy.Network = tc.network
			res := runAgent(t, req, confine.TestABIEnv+"="+tc.abi)
			if res.code != tc.wantCode {
				t.Fatalf("exit code = %d, want %d\nstderr: %s", res.code, tc.wantCode, res.stderr)
			}
			if !strings.Contains(res.stderr, tc.stderrHas) {
				t.Errorf("stderr lacks %q:\n%s", tc.stderrHas, res.stderr)
			}
			_, err := os.Stat(marker)
			if tc.wantCode == agentproto.ExitConfinement {
				if res.stdout != "" {
					t.Errorf("a refused run wrote a response: %s", res.stdout)
				}
				if err == nil {
					t.Error("a refused run ran the tool")
				}
			} else if err != nil {
				t.Errorf("the run did not run the tool: %v\nstdout: %s", err, res.stdout)
			}
		})
	}
}

func TestNetworkFalseDeniesTCPConnectExceptConnectPorts(t *testing.T) {
	t.Parallel()
	requireLandlock(t, confine.MinNetworkABI)
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	port := uint16(ln.Addr().(*net.TCPAddr).Port)

	tests := []struct {
		name         string
		network      bool
		connectPorts []uint16
		replyHas     []string
	}{
		{"Connect_is_denied", false, nil, []string{"Permission denied", "[exit code 1]"}},
		{"Connect_to_a_listed_port_is_allowed", false, []uint16{port}, []string{"connected", "[exit code 0]"}},
		{"Connect_is_allowed_with_network_true", true, nil, []string{"connected", "[exit code 0]"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			req := f.request(fmt.Sprintf("/sh bash -c 'exec 3<>/dev/tcp/127.0.0.1/%d && echo connected'", port))
			req.Policy.Network = tc.network
			req.Policy.ConnectPorts = tc.connectPorts
			runAgent(t, req).expect(t, agentproto.ExitOK, tc.replyHas...)
		})
	}
}

func TestToolsAllowAndDeny(t *testing.T) {
	t.Parallel()
	requireLandlock(t, confine.MinNetworkABI)

	tests := []struct {
		name        string
		tools       agentproto.Tools
		text        string
		replyHas    []string
		toolCallErr string
	}{
		{
			name:     "A_denied_shell_is_reported_in_the_reply",
			tools:    agentproto.Tools{Deny: []string{"shell"}},
			text:     "/sh echo hi",
			replyHas: []string{`cannot run "echo hi": the shell tool is denied`},
		},
		{
			name:     "An_allow_list_without_shell_denies_it",
			tools:    agentproto.Tools{Allow: []string{"read_file"}},
			text:     "/sh echo hi",
			replyHas: []string{"the shell tool is denied"},
		},
		{
			name:        "A_model_calling_a_denied_tool_gets_an_error",
			tools:       agentproto.Tools{Allow: []string{"shell", "write_file"}, Deny: []string{"write_file"}},
			text:        `/tool write_file {"path": "x.txt", "content": "x"}`,
			replyHas:    []string{"[write_file error]", `tool "write_file" is not available to this agent`},
			toolCallErr: "not available",
		},
		{
			name:     "An_allowed_tool_runs",
			tools:    agentproto.Tools{Allow: []string{"write_file"}},
			text:     `/tool write_file {"path": "x.txt", "content": "x"}`,
			replyHas: []string{"[write_file]\nwrote 1 bytes to "},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			req := f.request(tc.text)
			req.Agent.Tools = tc.tools
			res := runAgent(t, req)
			res.expect(t, agentproto.ExitOK, tc.replyHas...)
			if tc.toolCallErr != "" && (len(res.resp.ToolCalls) != 1 || !strings.Contains(res.resp.ToolCalls[0].Error, tc.toolCallErr)) {
				t.Errorf("tool calls = %+v, want one failing with %q", res.resp.ToolCalls, tc.toolCallErr)
			}
		})
	}
}

func TestMaxIterationsEndsTheRunWithAClearReply(t *testing.T) {
	t.Parallel()
	requireLandlock(t, confine.MinNetworkABI)
	f := newFixture(t)
	req := f.request("/sh echo once")
	req.Agent.MaxIterations = 1

	res := runAgent(t, req)
	res.expect(t, agentproto.ExitAgentError, "stopped after 1 steps")
	if res.resp.Error != "max iterations (1) reached" || res.resp.Usage.Iterations != 1 || len(res.resp.ToolCalls) != 1 {
		t.Errorf("response = %+v, want error 'max iterations (1) reached' after 1 iteration and 1 tool call", res.resp)
	}
}

func TestBadRequestsAreRefused(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	valid, err := json.Marshal(f.request("hi"))
	if err != nil {
		t.Fatal(err)
	}
	with := func(mutate func(r *agentproto.Request)) []byte {
		r := f.request("hi")
		mutate(&r)
		data, _ := json.Marshal(r)
		return data
	}

	tests := []struct {
		name      string
		stdin     []byte
		stderrHas string
	}{
		{"Empty_stdin", nil, "not a JSON object"},
		{"Not_JSON", []byte("hello"), "not a JSON object"},
		{"No_version", []byte(`{"run_id": "r"}`), "no version"},
		{"Another_version", bytes.Replace(valid, []byte(`"version":1`), []byte(`"version":2`), 1), "version 2 is not supported"},
		{"Another_version_with_fields_this_build_does_not_know_is_refused_for_its_version", bytes.Replace(valid, []byte(`{"version":1,`), []byte(`{"version":2,"extra":1,`), 1), "version 2 is not supported"},
		{"A_null_version", bytes.Replace(valid, []byte(`"version":1`), []byte(`"version":null`), 1), "no version"},
		{"Version_0", bytes.Replace(valid, []byte(`"version":1`), []byte(`"version":0`), 1), "version 0 is not supported"},
		{"A_field_of_the_wrong_type", bytes.Replace(valid, []byte(`"network":false`), []byte(`"network":"no"`), 1), "malformed request"},
		{"An_unknown_field", bytes.Replace(valid, []byte(`{"version":1,`), []byte(`{"version":1,"extra":1,`), 1), "unknown field"},
		{"A_policy_with_an_unknown_field", bytes.Replace(valid, []byte(`"network":false`), []byte(`"network":false,"denny":["/"]`), 1), "unknown field"},
		{"Trailing_data", append(append([]byte{}, valid...), []byte(`{}`)...), "trailing data"},
		{"No_run_id", with(func(r *agentproto.Request) { r.RunID = "" }), "no run_id"},
		{"A_relative_workspace", with(func(r *agentproto.Request) { r.Workspace = "agents/alpha" }), "not an absolute path"},
		{"A_relative_policy_path", with(func(r *agentproto.Request) { r.Policy.AllowRead = []string{"usr"} }), "not absolute"},
		{"Too_large", append([]byte(`{"version":1,"run_id":"`), bytes.Repeat([]byte("a"), 16<<20)...), "larger than"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			res := runAgent(t, tc.stdin)
			if res.code != agentproto.ExitBadRequest || res.stdout != "" {
				t.Fatalf("exit code = %d, stdout %q; want %d and nothing", res.code, res.stdout, agentproto.ExitBadRequest)
			}
			if !strings.Contains(res.stderr, tc.stderrHas) {
				t.Errorf("stderr lacks %q:\n%s", tc.stderrHas, res.stderr)
			}
		})
	}
}

func TestLocalProvider(t *testing.T) {
	t.Parallel()
	requireLandlock(t, confine.MinNetworkABI)

	t.Run("Answers_the_same_request_with_the_same_response", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		req := f.request("/sh echo out; echo err >&2; exit 4")
		first, second := runAgent(t, req), runAgent(t, req)
		first.expect(t, agentproto.ExitOK)
		// Span records carry the clock's times; everything else is the same.
		a, b := first.resp, second.resp
		a.Spans, b.Spans = nil, nil
		ja, _ := json.Marshal(a)
		jb, _ := json.Marshal(b)
		if string(ja) != string(jb) {
			t.Errorf("two runs differ:\n%s\n%s", ja, jb)
		}
		want := "$ echo out; echo err >&2; exit 4\nout\n\n[stderr]\nerr\n\n[exit code 4]"
		if first.resp.Reply != want {
			t.Errorf("reply = %q, want %q", first.resp.Reply, want)
		}
	})
	t.Run("Echoes_plain_text_under_the_name_from_SOUL_md", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		writeFile(t, filepath.Join(f.workspace, "SOUL.md"), "# Ada the Archivist\n\nYou keep records.\n")
		res := runAgent(t, f.request("hello there"))
		res.expect(t, agentproto.ExitOK)
		if res.resp.Reply != "Ada the Archivist: you said: hello there" || res.resp.Usage.Iterations != 1 {
			t.Errorf("response = %+v", res.resp)
		}
	})
	t.Run("Creates_a_SOUL_md_named_after_the_agent_on_first_use_and_keeps_it", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		runAgent(t, f.request("hello")).expect(t, agentproto.ExitOK)
		soul, err := os.ReadFile(filepath.Join(f.workspace, "SOUL.md"))
		if err != nil || !strings.HasPrefix(string(soul), "# Alpha\n") {
			t.Fatalf("SOUL.md = %q, %v; want one starting with # Alpha", soul, err)
		}
		writeFile(t, filepath.Join(f.workspace, "SOUL.md"), "# Renamed\n")
		if res := runAgent(t, f.request("hello")); res.resp.Reply != "Renamed: you said: hello" {
			t.Errorf("reply = %q; an existing SOUL.md must be kept", res.resp.Reply)
		}
	})
	t.Run("Sends_bad_tool_arguments_back_to_the_model", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		for _, args := range []string{`{"path": 5}`, `not json`} {
			res := runAgent(t, f.request("/tool read_file "+args))
			res.expect(t, agentproto.ExitOK, "[read_file error]\nbad arguments")
			if len(res.resp.ToolCalls) != 1 || !strings.Contains(res.resp.ToolCalls[0].Error, "bad arguments") {
				t.Errorf("tool calls = %+v, want one with bad arguments", res.resp.ToolCalls)
			}
		}
	})
	t.Run("Keeps_the_provider_key_out_of_tools", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		res := runAgent(t, f.request("/sh env; cat /proc/self/environ"))
		res.expect(t, agentproto.ExitOK, "TMPDIR="+f.workspace+"/.tmp")
		// runAgent fails the test when the key shows up in the output.
	})
	t.Run("Unknown_provider_kinds_are_an_agent_error", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		req := f.request("hi")
		req.Provider.Kind = "gemini"
		res := runAgent(t, req)
		res.expect(t, agentproto.ExitAgentError)
		if !strings.Contains(res.resp.Error, `provider kind "gemini" not available in this build`) {
			t.Errorf("error = %q", res.resp.Error)
		}
	})
	t.Run("A_fallback_provider_answers_when_the_primary_is_unavailable", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		req := f.request("hi")
		req.Provider.Kind = "anthropic"
		req.Fallback = []agentproto.Provider{{Name: "offline", Kind: "local"}}
		runAgent(t, req).expect(t, agentproto.ExitOK, "Alpha: you said: hi")
	})
}
