package isolation

import (
	"strings"
	"testing"
)

func TestInterpretMapsEveryWayAnAgentCanEnd(t *testing.T) {
	t.Parallel()
	good := `{"version":1,"run_id":"r1","reply":"hi"}`
	tests := []struct {
		name       string
		code       int
		stdout     string
		wantReason string
		wantDetail string
	}{
		{"Valid_response_is_a_result", 0, good, "", ""},
		{"Agent_error_with_a_response_is_a_result", 1, `{"version":1,"run_id":"r1","error":"max iterations"}`, "", ""},
		{"Confinement_failure_fails_closed", 3, "", ReasonConfinement, "exit code 3"},
		{"Rejected_request_is_a_crash", 2, "", ReasonCrashed, "rejected the request"},
		{"Garbage_on_stdout_is_a_bad_response", 0, "not json", ReasonBadResponse, "exit code 0"},
		{"Response_for_another_run_is_a_bad_response", 0, `{"version":1,"run_id":"other"}`, ReasonBadResponse, ""},
		{"Signal_exit_says_which_signal", 137, "", ReasonCrashed, "killed by signal 9"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			out := NewStdout()
			out.Write([]byte(tc.stdout))
			res, err := Interpret(Result{ExitCode: tc.code, Stderr: "agent log line"}, out, "r1")
			if got := ReasonOf(err); got != tc.wantReason {
				t.Fatalf("reason %q (err %v), want %q", got, err, tc.wantReason)
			}
			if tc.wantReason == "" && res.Response.RunID != "r1" {
				t.Fatalf("response not parsed: %+v", res.Response)
			}
			if err != nil && (!strings.Contains(err.Error(), tc.wantDetail) || !strings.Contains(err.Error(), "agent log line")) {
				t.Fatalf("error %q lacks %q or the stderr tail", err, tc.wantDetail)
			}
		})
	}
}

func TestOversizedResponseIsRefusedAndTailKeepsTheEnd(t *testing.T) {
	t.Parallel()
	out := NewStdout()
	out.Write([]byte(strings.Repeat("x", MaxResponse+1)))
	if _, err := Interpret(Result{}, out, "r1"); ReasonOf(err) != ReasonBadResponse || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("oversized response: %v", err)
	}
	tail := NewTail()
	tail.Write([]byte(strings.Repeat("a", StderrTail)))
	tail.Write([]byte("END"))
	if s := tail.String(); len(s) != StderrTail || !strings.HasSuffix(s, "END") {
		t.Fatalf("tail kept %d bytes ending %q", len(s), s[len(s)-3:])
	}
}
