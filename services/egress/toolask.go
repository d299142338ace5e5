package egress

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"

	"github.com/berth-dev/berth/internal/egresspolicy"
)

// berth-agent asks here, before running a tool call an [agents.tools] ask
// rule matches (egresspolicy.ToolAskPath, on its own channel only). The
// proxy judges the call against its own copy of the rules — the agent only
// says what it is about to run — and holds it as it holds an asked request:
// the same Ask on stdout, the same Answer on stdin, the same timeout and
// standing answers. A tool's request here, with the run token, is refused:
// no tool asks a person anything in berth-agent's name.

// maxToolAskBody bounds a question's body: a command a person may be shown
// and its JSON escapes.
const maxToolAskBody = 8 * egresspolicy.MaxToolAskCommand

func (s *Server) toolAsk(w http.ResponseWriter, r *http.Request) {
	if agent, _ := r.Context().Value(channelKey{}).(bool); !agent {
		http.Error(w, "berth egress: only berth-agent asks about its tool calls, on its own channel", http.StatusForbidden)
		return
	}
	if r.Method != http.MethodPost {
		http.Error(w, "berth egress: POST a tool ask", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxToolAskBody+1))
	if err != nil {
		http.Error(w, "berth egress: cannot read the tool ask: "+err.Error(), http.StatusBadRequest)
		return
	}
	var q egresspolicy.ToolAskRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if len(body) > maxToolAskBody || dec.Decode(&q) != nil || q.Tool == "" {
		http.Error(w, "berth egress: a tool ask is a JSON object with tool and command", http.StatusBadRequest)
		return
	}
	ans := s.judgeToolCall(r, q)
	s.log.Info("tool ask", "tool", q.Tool, "what", egresspolicy.Ask{Tool: q.Tool, Command: q.Command}.What(), "rule", ans.Rule, "allowed", ans.Allow, "reason", ans.Reason)
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(ans)
}

// judgeToolCall is the answer to q: held for a person when a rule of the
// run's matches it, refused when none does or it is too long to be read.
func (s *Server) judgeToolCall(r *http.Request, q egresspolicy.ToolAskRequest) egresspolicy.ToolAskAnswer {
	rule, ok := egresspolicy.MatchTool(s.pol.ToolAsk, q.Tool, q.Command)
	if !ok {
		return egresspolicy.ToolAskAnswer{Reason: fmt.Sprintf("no [agents.tools] ask rule of this run matches this %s call, so nobody can allow it", q.Tool)}
	}
	if n := len(q.Command); n > egresspolicy.MaxToolAskCommand {
		return egresspolicy.ToolAskAnswer{Rule: rule.Raw, Reason: fmt.Sprintf("the command is %d bytes, more than the %d a person is shown, so nobody was asked; split it into shorter commands", n, egresspolicy.MaxToolAskCommand)}
	}
	ap := s.hold(r.Context(), egresspolicy.Ask{Tool: q.Tool, Command: q.Command, Rule: rule.AskRule()})
	return egresspolicy.ToolAskAnswer{Allow: ap.allowed, By: ap.by, Rule: rule.Raw, Reason: ap.reason}
}
