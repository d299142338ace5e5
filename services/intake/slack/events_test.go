package slack

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/berth-dev/berth/services/intake/connector"
	"github.com/berth-dev/berth/services/intake/slack/slacktest"
)

const testSigningSecret = "8f742231b10e8888abcd99yyyzzz85a5"

// eventsEndpoint serves an events-mode connector as intake would, at
// /hooks/{id}, on a clock the test drives.
func eventsEndpoint(t *testing.T, fake *slacktest.Server, sink connector.Sink) (*Connector, string, *clockwork.FakeClock, *logBuffer) {
	t.Helper()
	log, logs := testLogger(t)
	clock := clockwork.NewFakeClockAt(time.Unix(1767326125, 0))
	c, err := New("slack-events", Options{
		Mode:          ModeEvents,
		BaseURL:       fake.APIURL(),
		BotToken:      fake.Options().BotToken,
		SigningSecret: testSigningSecret,
		Logger:        log,
		Clock:         clock,
	})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/hooks/slack-events", c.Handler(sink))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return c, srv.URL + "/hooks/slack-events", clock, logs
}

func do(t *testing.T, req *http.Request) (int, string) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func TestEventsAPISignatureVectors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		tamper func(req *http.Request, body []byte, now time.Time) *http.Request
		status int
	}{
		{name: "A_good_signature_is_accepted", status: http.StatusOK},
		{name: "A_tampered_body_is_rejected", status: http.StatusUnauthorized,
			tamper: func(req *http.Request, body []byte, now time.Time) *http.Request {
				forged := strings.Replace(string(body), "deploy", "destroy", 1)
				r, _ := http.NewRequestWithContext(req.Context(), http.MethodPost, req.URL.String(), strings.NewReader(forged))
				r.Header = req.Header.Clone()
				return r
			}},
		{name: "A_timestamp_older_than_five_minutes_is_rejected", status: http.StatusUnauthorized,
			tamper: func(req *http.Request, body []byte, now time.Time) *http.Request {
				r, _ := slacktest.SignedRequest(req.Context(), req.URL.String(), testSigningSecret, now.Add(-5*time.Minute-time.Second), body)
				return r
			}},
		{name: "A_timestamp_five_minutes_in_the_future_is_rejected", status: http.StatusUnauthorized,
			tamper: func(req *http.Request, body []byte, now time.Time) *http.Request {
				r, _ := slacktest.SignedRequest(req.Context(), req.URL.String(), testSigningSecret, now.Add(5*time.Minute+time.Second), body)
				return r
			}},
		{name: "A_timestamp_four_minutes_old_is_accepted", status: http.StatusOK,
			tamper: func(req *http.Request, body []byte, now time.Time) *http.Request {
				r, _ := slacktest.SignedRequest(req.Context(), req.URL.String(), testSigningSecret, now.Add(-4*time.Minute), body)
				return r
			}},
		{name: "Missing_headers_are_rejected", status: http.StatusUnauthorized,
			tamper: func(req *http.Request, body []byte, now time.Time) *http.Request {
				req.Header.Del("X-Slack-Signature")
				req.Header.Del("X-Slack-Request-Timestamp")
				return req
			}},
		{name: "A_missing_timestamp_is_rejected", status: http.StatusUnauthorized,
			tamper: func(req *http.Request, body []byte, now time.Time) *http.Request {
				req.Header.Del("X-Slack-Request-Timestamp")
				return req
			}},
		{name: "A_wrong_secret_is_rejected", status: http.StatusUnauthorized,
			tamper: func(req *http.Request, body []byte, now time.Time) *http.Request {
				r, _ := slacktest.SignedRequest(req.Context(), req.URL.String(), "not-the-secret", now, body)
				return r
			}},
		{name: "A_signature_without_v0_is_rejected", status: http.StatusUnauthorized,
			tamper: func(req *http.Request, body []byte, now time.Time) *http.Request {
				req.Header.Set("X-Slack-Signature", strings.TrimPrefix(req.Header.Get("X-Slack-Signature"), "v0="))
				return req
			}},
		{name: "A_signature_that_is_not_hex_is_rejected", status: http.StatusUnauthorized,
			tamper: func(req *http.Request, body []byte, now time.Time) *http.Request {
				req.Header.Set("X-Slack-Signature", "v0=zz"+strings.Repeat("0", 62))
				return req
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := testContext(t)
			fake := slacktest.New(t, slacktest.Options{})
			sink := newSink()
			_, url, clock, logs := eventsEndpoint(t, fake, sink)
			ev := mention(fake, "deploy the thing")
			body := fake.Callback(ev)
			req, err := slacktest.SignedRequest(ctx, url, testSigningSecret, clock.Now(), body)
			if err != nil {
				t.Fatal(err)
			}
			if tc.tamper != nil {
				req = tc.tamper(req, body, clock.Now())
			}
			status, _ := do(t, req)
			if status != tc.status {
				t.Fatalf("status = %d, want %d", status, tc.status)
			}
			calls := sink.Calls()
			if tc.status == http.StatusOK {
				if len(calls) != 1 || calls[0].ID != "C0CHAN:"+ev.TS || calls[0].Thread != ev.TS || calls[0].Server != fake.Options().TeamID {
					t.Errorf("sink got %+v, want the message", calls)
				}
				return
			}
			if len(calls) != 0 {
				t.Errorf("a rejected request reached the sink: %+v", calls)
			}
			if !strings.Contains(logs.String(), "rejected a Slack request") {
				t.Errorf("no log line for the rejected request:\n%s", logs.String())
			}
			if strings.Contains(logs.String(), testSigningSecret) {
				t.Errorf("the signing secret is in the log")
			}
		})
	}
}

func TestEventsAPIAnswersURLVerificationWithTheChallenge(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	fake := slacktest.New(t, slacktest.Options{})
	sink := newSink()
	_, url, clock, _ := eventsEndpoint(t, fake, sink)
	body := []byte(`{"token":"Jhj5dZrVaK7ZwHHjRyZWjbDl","challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P","type":"url_verification"}`)
	req, _ := slacktest.SignedRequest(ctx, url, testSigningSecret, clock.Now(), body)
	status, got := do(t, req)
	if status != http.StatusOK || got != "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P" {
		t.Errorf("answer = %d %q, want 200 with the challenge", status, got)
	}
	if len(sink.Calls()) != 0 {
		t.Errorf("url_verification reached the sink")
	}
}

func TestEventsAPIRetryOfAStoredEventIsAcceptedAgainWithTheSameID(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	fake := slacktest.New(t, slacktest.Options{})
	sink := newSink()
	_, url, clock, _ := eventsEndpoint(t, fake, sink)
	body := fake.Callback(mention(fake, "once"))
	for retry := range 2 {
		req, _ := slacktest.SignedRequest(ctx, url, testSigningSecret, clock.Now(), body)
		if retry > 0 {
			req.Header.Set("X-Slack-Retry-Num", "1")
			req.Header.Set("X-Slack-Retry-Reason", "http_timeout")
		}
		if status, _ := do(t, req); status != http.StatusOK {
			t.Fatalf("delivery %d: status %d, want 200", retry, status)
		}
	}
	calls := sink.Calls()
	if len(calls) != 2 || calls[0].ID != calls[1].ID {
		t.Errorf("sink got %+v, want the event and its retry with one id", calls)
	}
}

func TestEventsAPIAnswers500WhenIntakeCannotStoreSoSlackRetries(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	fake := slacktest.New(t, slacktest.Options{})
	sink := newSink()
	sink.accept = func(connector.Message) error { return errors.New("disk full") }
	c, url, clock, _ := eventsEndpoint(t, fake, sink)
	req, _ := slacktest.SignedRequest(ctx, url, testSigningSecret, clock.Now(), fake.Callback(mention(fake, "x")))
	if status, _ := do(t, req); status != http.StatusInternalServerError {
		t.Errorf("status = %d, want 500", status)
	}
	if st := c.Status(); st.State != connector.StateHTTP || !strings.Contains(st.LastError, "disk full") {
		t.Errorf("status = %+v", st)
	}
}

func TestEventsAPIBadInputStoresNothing(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		method string
		body   string
		status int
	}{
		{"Malformed_JSON_is_refused", http.MethodPost, `{"type":`, http.StatusBadRequest},
		{"An_event_without_a_type_is_refused", http.MethodPost, `{"type":"event_callback","event":{}}`, http.StatusBadRequest},
		{"An_unknown_event_type_is_ignored", http.MethodPost, `{"type":"event_callback","event":{"type":"reaction_added"}}`, http.StatusOK},
		{"An_unknown_payload_type_is_ignored", http.MethodPost, `{"type":"something_new"}`, http.StatusOK},
		{"A_GET_is_refused", http.MethodGet, ``, http.StatusMethodNotAllowed},
		{"An_oversized_body_is_refused", http.MethodPost, `{"type":"event_callback","pad":"` + strings.Repeat("x", 2<<20) + `"}`, http.StatusRequestEntityTooLarge},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := testContext(t)
			fake := slacktest.New(t, slacktest.Options{})
			sink := newSink()
			_, url, clock, _ := eventsEndpoint(t, fake, sink)
			req, _ := slacktest.SignedRequest(ctx, url, testSigningSecret, clock.Now(), []byte(tc.body))
			req.Method = tc.method
			if status, _ := do(t, req); status != tc.status {
				t.Errorf("status = %d, want %d", status, tc.status)
			}
			if calls := sink.Calls(); len(calls) != 0 {
				t.Errorf("bad input reached the sink: %+v", calls)
			}
		})
	}
}

func TestEventsModeRunReturnsAtOnceAndIsNotLongLived(t *testing.T) {
	t.Parallel()
	fake := slacktest.New(t, slacktest.Options{})
	c, _, _, _ := eventsEndpoint(t, fake, newSink())
	if err := c.Run(context.Background(), newSink()); err != nil {
		t.Errorf("Run = %v, want nil at once", err)
	}
	if c.LongLived() {
		t.Errorf("an events-mode connector keeps intake up")
	}
	if st := c.Status(); st.State != connector.StateHTTP || st.Type != "slack" {
		t.Errorf("status = %+v", st)
	}
}

func TestSocketModeAndEventsAPIGiveOneMessageTheSameID(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	fake := slacktest.New(t, slacktest.Options{})
	socketSink, httpSink := newSink(), newSink()
	startSocket(t, fake, socketSink, nil)
	_, url, _, _ := eventsEndpoint(t, fake, httpSink)
	ev := mention(fake, "either way")
	if _, err := fake.Deliver(ctx, ev); err != nil {
		t.Fatal(err)
	}
	// eventsEndpoint's clock is fixed near the fake's ts; sign at that time.
	req, _ := slacktest.SignedRequest(ctx, url, testSigningSecret, time.Unix(1767326125, 0), fake.Callback(ev))
	if status, _ := do(t, req); status != http.StatusOK {
		t.Fatalf("status = %d", status)
	}
	s, h := socketSink.wait(ctx, t, 1)[0], httpSink.Calls()
	if len(h) != 1 || s.ID != h[0].ID || s.Thread != h[0].Thread || s.Server != h[0].Server {
		t.Errorf("socket gave %+v, HTTP gave %+v: want the same id, thread and team", s, h)
	}
}

func TestPostEventSignsAsSlackDoes(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	fake := slacktest.New(t, slacktest.Options{})
	sink := newSink()
	log, _ := testLogger(t)
	c, err := New("slack-events", Options{Mode: ModeEvents, BaseURL: fake.APIURL(), BotToken: fake.Options().BotToken,
		SigningSecret: testSigningSecret, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(c.Handler(sink))
	t.Cleanup(srv.Close)
	status, err := fake.PostEvent(ctx, srv.URL, testSigningSecret, mention(fake, "real clock"))
	if err != nil || status != http.StatusOK || len(sink.Calls()) != 1 {
		t.Errorf("PostEvent = %d, %v; sink %+v", status, err, sink.Calls())
	}
}

func TestAWrongSigningSecretBecomesAStandingWarningUntilARequestVerifies(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	fake := slacktest.New(t, slacktest.Options{})
	c, url, clock, _ := eventsEndpoint(t, fake, newSink())
	post := func(secret string) {
		req, _ := slacktest.SignedRequest(ctx, url, secret, clock.Now(), fake.Callback(mention(fake, "x")))
		do(t, req)
	}
	for range 3 {
		post("the-old-secret")
	}
	if st := c.Status(); !strings.Contains(st.Warning, "signing_secret") || strings.Contains(st.Warning, testSigningSecret) {
		t.Errorf("Warning = %q, want one naming signing_secret (and not its value)", st.Warning)
	}
	post(testSigningSecret)
	if st := c.Status(); st.Warning != "" {
		t.Errorf("Warning = %q after a verified request, want none", st.Warning)
	}
}
