package connector_test

import (
	"testing"

	"github.com/berth-dev/berth/services/intake/connector"
)

const approvalID = "20261203T111500_123456789_abcdef0123-0123456789abcdef"

func TestKeywordsAreDecisionsAndOtherTextIsAMessage(t *testing.T) {
	t.Parallel()
	tests := []struct {
		text string
		want string // the decision, "" for an ordinary message
	}{
		{"approve " + approvalID, connector.DecideAllowOnce},
		{"  Allow " + approvalID + "  ", connector.DecideAllowOnce},
		{"approve " + approvalID + " for conversation", connector.DecideAllowConversation},
		{"APPROVE " + approvalID + " for this conversation", connector.DecideAllowConversation},
		{"deny " + approvalID, connector.DecideDeny},
		// Ordinary messages stay messages for the agent.
		{"deny " + approvalID + " for conversation", ""}, // not offered
		{"allow everything", ""},
		{"deny it", ""},
		{"approve run1-a1", ""}, // not an id the scheduler makes
		{"please approve " + approvalID, ""},
		{"approve " + approvalID + " and then deploy", ""},
		{"approve " + approvalID + "\nrm -rf /", ""},
		{"approve " + approvalID + " " + approvalID, ""},
		{"", ""},
	}
	for _, tc := range tests {
		d, ok := connector.ParseDecision(tc.text)
		if got := map[bool]string{true: d.Decision}[ok]; got != tc.want {
			t.Errorf("ParseDecision(%q) = %q (%v), want %q", tc.text, got, ok, tc.want)
		}
		if ok && d.ApprovalID != approvalID {
			t.Errorf("ParseDecision(%q) read id %q", tc.text, d.ApprovalID)
		}
	}
}

func TestAButtonValueIsReadBackAndNothingElseIs(t *testing.T) {
	t.Parallel()
	for _, c := range []string{connector.DecideAllowOnce, connector.DecideAllowConversation, connector.DecideDeny} {
		v := connector.ChoiceValue(approvalID, c)
		if len(v) > 100 {
			t.Errorf("%q is %d bytes: over Discord's custom_id and Slack's action_id limits", v, len(v))
		}
		d, ok := connector.ParseChoice(v)
		if !ok || d.Decision != c || d.ApprovalID != approvalID {
			t.Errorf("ParseChoice(%q) = %+v, %v", v, d, ok)
		}
	}
	for _, v := range []string{
		"", approvalID, "allow_once:" + approvalID, // not berth's
		"berth-approval:allow_always:" + approvalID, // no such decision
		"berth-approval:allow_once:", "berth-approval:allow_once",
		"berth-approval:deny:<@U1>", "berth-approval:deny:a b",
	} {
		if d, ok := connector.ParseChoice(v); ok {
			t.Errorf("ParseChoice(%q) = %+v, want refused", v, d)
		}
	}
}
