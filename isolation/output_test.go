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

// Complete says one line arrived whole; whether it is a response is for
// Response (TestAnAnswerEnds..., TestARunWhoseAnswerDoesNotStand...).
func TestStdoutIsCompleteOnceItHoldsOneWholeResponseLine(t *testing.T) {
	t.Parallel()
	good := `{"version":1,"run_id":"r1","reply":"hi"}`
	tests := []struct {
		name     string
		writes   []string
		complete bool
	}{
		{"A_response_line_in_one_write_is_complete", []string{good + "\n"}, true},
		{"A_response_in_pieces_completes_with_its_newline", []string{good[:9], good[9:], "\n"}, true},
		{"A_response_without_its_newline_is_not_complete", []string{good}, false},
		{"Two_values_are_not_one_response", []string{good + "\n" + good + "\n"}, false},
		{"A_first_line_with_more_after_it_is_not_one_response", []string{`{"version":1`, "\n" + good + "\n"}, false},
		{"An_oversized_response_is_not_complete", []string{strings.Repeat(" ", MaxResponse), good + "\n"}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			out := NewStdout()
			for i, w := range tc.writes {
				if i == len(tc.writes)-1 {
					break
				}
				out.Write([]byte(w))
				if isClosed(out.Complete()) {
					t.Fatalf("complete after write %d of %d (%q)", i+1, len(tc.writes), w)
				}
			}
			out.Write([]byte(tc.writes[len(tc.writes)-1]))
			if got := isClosed(out.Complete()); got != tc.complete {
				t.Fatalf("complete = %v after %q, want %v", got, tc.writes, tc.complete)
			}
		})
	}
}

func TestAnAnswerEndsTheRunOnlyWhenItIsThisRunsAndNoToolWasKilled(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		stdout   string
		ok       bool
		wantCode int
	}{
		{"A_reply_of_this_run_is_an_answer_that_exited_0", `{"version":1,"run_id":"r1","reply":"hi"}`, true, 0},
		{"An_agent_error_of_this_run_is_an_answer_that_exited_1", `{"version":1,"run_id":"r1","reply":"sorry","error":"max iterations reached"}`, true, 1},
		{"A_response_for_another_run_is_no_answer", `{"version":1,"run_id":"r2","reply":"hi"}`, false, 0},
		{"A_response_of_another_version_is_no_answer", `{"version":2,"run_id":"r1","reply":"hi"}`, false, 0},
		{"A_tool_that_died_of_SIGKILL_may_be_an_OOM_kill_so_no_answer", `{"version":1,"run_id":"r1","reply":"hi","tool_calls":[{"name":"sh","output":"{\"exit_code\":137}"}]}`, false, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			out, tail := NewStdout(), NewTail()
			out.Write([]byte(tc.stdout + "\n"))
			tail.Write([]byte("agent log line"))
			res, ok := answered(Spec{Plan: Plan{RunID: "r1"}}, out, tail)
			if ok != tc.ok {
				t.Fatalf("answered = %v, want %v (result %+v)", ok, tc.ok, res)
			}
			if !ok {
				return
			}
			if res.ExitCode != tc.wantCode || res.Response.RunID != "r1" || res.Response.Reply == "" || res.Stderr != "agent log line" {
				t.Fatalf("answer %+v: want exit code %d, the run's reply and the stderr tail", res, tc.wantCode)
			}
		})
	}
}

func TestTheAgentsLogEndsWithItsResponseFollowsLine(t *testing.T) {
	t.Parallel()
	last := `{"time":"2026-12-01T14:00:00Z","level":"INFO","msg":"` + ResponseFollows + `","run_id":"r1"}` + "\n"
	tests := []struct {
		name   string
		writes []string
		ended  bool
	}{
		{"The_line_after_other_lines_ends_the_log", []string{`{"msg":"confined with Landlock"}` + "\n", last}, true},
		{"The_line_in_the_same_write_as_others_ends_the_log", []string{`{"msg":"tool call"}` + "\n" + last}, true},
		{"The_line_split_across_writes_ends_the_log", []string{last[:40], last[40:52], last[52:]}, true},
		{"The_line_after_a_tail_longer_than_kept_ends_the_log", []string{strings.Repeat("x", StderrTail+10) + "\n", last}, true},
		{"A_log_without_the_line_has_not_ended", []string{`{"msg":"confined with Landlock"}` + "\n", `{"msg":"tool call"}` + "\n"}, false},
		{"Another_message_that_starts_alike_has_not_ended_it", []string{`{"msg":"response follows soon"}` + "\n"}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tail := NewTail()
			for _, w := range tc.writes {
				tail.Write([]byte(w))
			}
			if got := isClosed(tail.Ended()); got != tc.ended {
				t.Fatalf("ended = %v after %q, want %v", got, tc.writes, tc.ended)
			}
		})
	}
}

// What noticing the end of the response and of the log costs per run: a
// 64 KiB response in 4 KiB writes and 8 KiB of log lines.
func BenchmarkStdoutAndTailOfOneRun(b *testing.B) {
	resp := []byte(`{"version":1,"run_id":"r1","reply":"` + strings.Repeat("x", 64<<10) + `"}` + "\n")
	line := []byte(`{"time":"2026-12-01T14:00:00Z","level":"INFO","msg":"tool call","tool":"shell","failed":false}` + "\n")
	last := []byte(`{"time":"2026-12-01T14:00:00Z","level":"INFO","msg":"` + ResponseFollows + `"}` + "\n")
	b.ReportAllocs()
	for b.Loop() {
		out, tail := NewStdout(), NewTail()
		for range 8 << 10 / len(line) {
			tail.Write(line)
		}
		tail.Write(last)
		for i := 0; i < len(resp); i += 4 << 10 {
			out.Write(resp[i:min(i+4<<10, len(resp))])
		}
		if !isClosed(out.Complete()) || !isClosed(tail.Ended()) {
			b.Fatal("the end of the response or the log went unnoticed")
		}
	}
}
