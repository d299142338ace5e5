package daemon

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

func TestIdle(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		busy     func(calls int) bool
		request  time.Duration // how long a request is in flight at the start
		wantIdle bool
	}{
		{name: "Idle_after_the_timeout_with_nothing_to_do", wantIdle: true},
		{name: "Not_idle_while_there_is_pending_work", busy: func(int) bool { return true }},
		{name: "Not_idle_while_a_request_runs", request: time.Hour},
		{name: "Idle_once_pending_work_is_done", busy: func(calls int) bool { return calls < 3 }, wantIdle: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			idle := NewIdle()
			release := make(chan struct{})
			defer close(release)
			if tc.request > 0 {
				started := make(chan struct{})
				h := idle.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
					close(started)
					<-release
				}))
				go h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("POST", "/", nil))
				<-started
			}
			var busy func() bool
			var calls atomic.Int32
			if tc.busy != nil {
				busy = func() bool { return tc.busy(int(calls.Add(1))) }
			}
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			start := time.Now()
			got := idle.Wait(ctx, 100*time.Millisecond, busy)
			if got != tc.wantIdle {
				t.Fatalf("Wait = %v, want %v", got, tc.wantIdle)
			}
			if got && time.Since(start) < 100*time.Millisecond {
				t.Fatalf("idle after %s, before the 100ms timeout", time.Since(start))
			}
		})
	}
}
