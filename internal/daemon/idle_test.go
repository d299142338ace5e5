package daemon

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
)

func TestIdle(t *testing.T) {
	t.Parallel()
	const after = time.Minute
	step := IdleCheckInterval(after)
	tests := []struct {
		name     string
		busy     func(calls int) bool
		request  bool // a request stays in flight the whole time
		wantIdle time.Duration
	}{
		{name: "Idle_after_the_timeout_with_nothing_to_do", wantIdle: after},
		{name: "Not_idle_while_there_is_pending_work", busy: func(int) bool { return true }},
		{name: "Not_idle_while_a_request_runs", request: true},
		{name: "Idle_a_full_timeout_after_pending_work_is_done", busy: func(calls int) bool { return calls <= 3 }, wantIdle: 3*step + after},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clock := clockwork.NewFakeClock()
			start := clock.Now()
			idle := NewIdle(clock)
			release := make(chan struct{})
			defer close(release)
			if tc.request {
				started := make(chan struct{})
				h := idle.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
					close(started)
					<-release
				}))
				go h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("POST", "/", nil))
				<-started
			}
			// busy is called at every check: it tells the test a check ran.
			checked := make(chan struct{})
			calls := 0
			busy := func() bool {
				calls++
				checked <- struct{}{}
				return tc.busy != nil && tc.busy(calls)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			result := make(chan bool, 1)
			go func() { result <- idle.Wait(ctx, after, busy) }()
			if err := clock.BlockUntilContext(ctx, 1); err != nil {
				t.Fatal(err)
			}
			for clock.Since(start) < 3*after {
				clock.Advance(step)
				select {
				case <-checked:
				case got := <-result:
					t.Fatalf("Wait returned %v after %s, want idle after %s (0: never)", got, clock.Since(start)-step, tc.wantIdle)
				}
				if tc.wantIdle != 0 && clock.Since(start) == tc.wantIdle {
					select {
					case got := <-result:
						if !got {
							t.Fatal("Wait returned false, want idle")
						}
					case <-time.After(10 * time.Second):
						t.Fatalf("not idle after %s", tc.wantIdle)
					}
					return
				}
			}
			if tc.wantIdle != 0 {
				t.Fatalf("not idle after %s, want idle after %s", clock.Since(start), tc.wantIdle)
			}
			cancel()
			if got := <-result; got {
				t.Fatal("Wait returned true once its context was canceled")
			}
		})
	}
}
