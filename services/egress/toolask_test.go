package egress_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/egresspolicy"
	"github.com/berth-dev/berth/services/egress"
)

const toolAskAgentToken = "agent-token-of-the-tool-ask-tests"

func toolRules(t *testing.T, raw ...string) []egresspolicy.ToolRule {
	t.Helper()
	var out []egresspolicy.ToolRule
	for _, s := range raw {
		r, err := egresspolicy.ParseToolRule(s)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	return out
}

// toolAsked is what berth-agent got back for a tool ask.
type toolAsked struct {
	code   int
	answer egresspolicy.ToolAskAnswer
	body   string
}

// askTool asks the proxy about a tool call in the background, with tok
// (the agent's token, or a tool's).
func (ap askingProxy) askTool(t *testing.T, tok, tool, command string) <-chan toolAsked {
	t.Helper()
	out := make(chan toolAsked, 1)
	body, _ := json.Marshal(egresspolicy.ToolAskRequest{Tool: tool, Command: command})
	c := proxy{socket: ap.socket}.origin(tok)
	go func() {
		resp, err := c.Post("http://egress"+egresspolicy.ToolAskPath, "application/json", bytes.NewReader(body))
		if err != nil {
			out <- toolAsked{body: err.Error()}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		got := toolAsked{code: resp.StatusCode, body: string(b)}
		json.Unmarshal(b, &got.answer)
		out <- got
	}()
	return out
}

func (ap askingProxy) toolAnswer(t *testing.T, got <-chan toolAsked) toolAsked {
	t.Helper()
	select {
	case a := <-got:
		return a
	case <-time.After(15 * time.Second):
		t.Fatal("the tool ask was never answered")
	}
	return toolAsked{}
}

func launchToolAsking(t *testing.T, pol egress.Policy) askingProxy {
	t.Helper()
	pol.AgentToken = toolAskAgentToken
	return launchAsking(t, pol)
}

func TestAToolCallAnAskRuleMatchesWaitsForAPersonsAnswer(t *testing.T) {
	t.Parallel()
	ap := launchToolAsking(t, egress.Policy{ToolAsk: toolRules(t, "shell: git push *", "write_file")})

	t.Run("An_allow_answer_lets_it_run_and_names_the_approver", func(t *testing.T) {
		got := ap.askTool(t, toolAskAgentToken, "shell", "git push origin main")
		ask := ap.nextAsk(t)
		if ask.ID == "" || ask.Tool != "shell" || ask.Command != "git push origin main" || ask.Rule != "[agents.tools] shell: git push *" ||
			ask.Method != "" || ask.Host != "" || ask.What() != "shell: git push origin main" {
			t.Fatalf("ask = %+v, want the shell command by its rule", ask)
		}
		if err := ap.Answer(egresspolicy.Answer{ID: ask.ID, Allow: true, By: "berthctl:root"}); err != nil {
			t.Fatal(err)
		}
		res := ap.toolAnswer(t, got)
		if res.code != 200 || !res.answer.Allow || res.answer.By != "berthctl:root" || res.answer.Reason != "approved by berthctl:root" || res.answer.Rule != "shell: git push *" {
			t.Fatalf("answer = %+v, want allowed, approved by berthctl:root", res)
		}
		ap.settledAs(t, egresspolicy.Answer{ID: ask.ID, Allow: true, By: "berthctl:root"})
	})

	t.Run("A_deny_answer_refuses_it_naming_the_decider", func(t *testing.T) {
		got := ap.askTool(t, toolAskAgentToken, "write_file", `{"path":"a"}`)
		ask := ap.nextAsk(t)
		if ask.What() != `write_file: {"path":"a"}` || ask.Rule != "[agents.tools] write_file" {
			t.Fatalf("ask = %+v", ask)
		}
		ap.Answer(egresspolicy.Answer{ID: ask.ID, By: "slack:U012345"})
		if res := ap.toolAnswer(t, got); res.code != 200 || res.answer.Allow || res.answer.Reason != "denied by slack:U012345" {
			t.Fatalf("answer = %+v, want denied by slack:U012345", res)
		}
		ap.settledAs(t, egresspolicy.Answer{ID: ask.ID, By: "slack:U012345"})
	})

	t.Run("A_command_with_control_characters_is_asked_as_it_is_and_shown_quoted", func(t *testing.T) {
		command := "git push origin main\n\x1b[1A\x1b[2Kecho harmless"
		got := ap.askTool(t, toolAskAgentToken, "shell", command)
		ask := ap.nextAsk(t)
		if ask.Command != command || ask.What() != `shell: "git push origin main\n\x1b[1A\x1b[2Kecho harmless"` {
			t.Fatalf("ask = %+v, What() %s; want the command whole and its What quoted", ask, ask.What())
		}
		ap.Answer(egresspolicy.Answer{ID: ask.ID, By: "berthctl:root"})
		ap.toolAnswer(t, got)
		<-ap.settled
	})

	t.Run("The_proxy_judges_a_call_no_rule_matches_and_asks_nobody", func(t *testing.T) {
		res := ap.toolAnswer(t, ap.askTool(t, toolAskAgentToken, "shell", "git pull"))
		if res.code != 200 || res.answer.Allow || !strings.Contains(res.answer.Reason, "no [agents.tools] ask rule") {
			t.Fatalf("answer = %+v, want refused: no rule matches", res)
		}
		ap.noAsk(t)
	})

	t.Run("A_command_too_long_to_read_is_denied_unasked", func(t *testing.T) {
		res := ap.toolAnswer(t, ap.askTool(t, toolAskAgentToken, "shell", "git push "+strings.Repeat("x", egresspolicy.MaxToolAskCommand)))
		if res.answer.Allow || !strings.Contains(res.answer.Reason, "nobody was asked") {
			t.Fatalf("answer = %+v, want denied unasked", res)
		}
		ap.noAsk(t)
	})

	t.Run("A_tools_token_cannot_ask", func(t *testing.T) {
		res := ap.toolAnswer(t, ap.askTool(t, token, "shell", "git push origin main"))
		if res.code != http.StatusForbidden || res.answer.Allow || !strings.Contains(res.body, "only berth-agent asks") {
			t.Fatalf("answer = %+v, want 403: only berth-agent asks", res)
		}
		res = ap.toolAnswer(t, ap.askTool(t, "forged-"+toolAskAgentToken, "shell", "git push origin main"))
		if res.code != http.StatusProxyAuthRequired || res.answer.Allow {
			t.Fatalf("answer to a forged token = %+v, want 407", res)
		}
		ap.noAsk(t)
	})

	t.Run("A_standing_answer_covers_its_rule_only", func(t *testing.T) {
		got := ap.askTool(t, toolAskAgentToken, "shell", "git push origin a")
		ask := ap.nextAsk(t)
		ap.Answer(egresspolicy.Answer{ID: ask.ID, Allow: true, Standing: true, By: "discord:81234"})
		if res := ap.toolAnswer(t, got); !res.answer.Allow {
			t.Fatalf("answer = %+v", res)
		}
		<-ap.settled
		if res := ap.toolAnswer(t, ap.askTool(t, toolAskAgentToken, "shell", "cd repo && git push origin b")); !res.answer.Allow || res.answer.Reason != "approved earlier by discord:81234" {
			t.Fatalf("a later push: %+v, want approved earlier, unasked", res)
		}
		ap.noAsk(t)
		other := ap.askTool(t, toolAskAgentToken, "write_file", `{"path":"b"}`)
		ask = ap.nextAsk(t)
		if ask.Rule != "[agents.tools] write_file" {
			t.Fatalf("ask = %+v, want write_file asked again", ask)
		}
		ap.Answer(egresspolicy.Answer{ID: ask.ID, By: "berthctl:root"})
		ap.toolAnswer(t, other)
		<-ap.settled
	})
}

func TestAToolCallNobodyAnswersIsDeniedByTheTimeout(t *testing.T) {
	t.Parallel()
	ap := launchToolAsking(t, egress.Policy{ToolAsk: toolRules(t, "shell"), ApprovalTimeout: time.Second})
	got := ap.askTool(t, toolAskAgentToken, "shell", "touch /workspace/x")
	ask := ap.nextAsk(t)
	res := ap.toolAnswer(t, got)
	if res.answer.Allow || res.answer.By != egresspolicy.ByTimeout || res.answer.Reason != "not approved within 1s" {
		t.Fatalf("answer = %+v, want not approved within 1s", res)
	}
	ap.settledAs(t, egresspolicy.Answer{ID: ask.ID, By: egresspolicy.ByTimeout})
}

// A standing answer to an egress rule never answers a tool call: a tool
// rule's Ask names it "[agents.tools] …", apart from every egress rule
// (a host may be called "shell").
func TestToolAndEgressStandingAnswersStayApart(t *testing.T) {
	t.Parallel()
	site, _ := upstream(t)
	addr := site.Listener.Addr().String()
	ap := launchToolAsking(t, egress.Policy{Ask: []egresspolicy.Rule{rule(t, addr)}, ToolAsk: toolRules(t, "shell")})
	got := ap.send(t, "GET", site.URL+"/x")
	ask := ap.nextAsk(t)
	ap.Answer(egresspolicy.Answer{ID: ask.ID, Allow: true, Standing: true, By: "slack:U1"})
	ap.result(t, got)
	ap.nextDecision(t)
	<-ap.settled
	tool := ap.askTool(t, toolAskAgentToken, "shell", "ls")
	if ask := ap.nextAsk(t); ask.Tool != "shell" {
		t.Fatalf("ask = %+v, want the tool call asked", ask)
	} else {
		ap.Answer(egresspolicy.Answer{ID: ask.ID, By: "slack:U1"})
	}
	if res := ap.toolAnswer(t, tool); res.answer.Allow {
		t.Fatalf("the egress rule's standing answer allowed a tool call: %+v", res)
	}
}
