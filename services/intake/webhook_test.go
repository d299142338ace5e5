package intake

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/services/intake/connector"
)

func TestWebhookRejectionsStoreNothing(t *testing.T) {
	t.Parallel()
	valid := `{"id":"m1","channel":"ops","author":"ada","text":"hello"}`
	now := time.Now()
	tests := []struct {
		name       string
		request    func() *http.Request
		wantStatus int
		wantError  string
	}{
		{"Bad_signature_is_unauthorized", func() *http.Request {
			return signedRequest("hooks", []byte(valid), "wrong-secret", now)
		}, http.StatusUnauthorized, "bad signature"},
		{"Signature_of_another_body_is_unauthorized", func() *http.Request {
			r := signedRequest("hooks", []byte(valid), testSecret, now)
			r.Body = httpBody(strings.Replace(valid, "hello", "rm -rf /", 1))
			return r
		}, http.StatusUnauthorized, "bad signature"},
		{"Signature_for_another_timestamp_is_unauthorized", func() *http.Request {
			r := signedRequest("hooks", []byte(valid), testSecret, now.Add(-10*time.Minute))
			r.Header.Set(HeaderTimestamp, strconv.FormatInt(now.Unix(), 10))
			return r
		}, http.StatusUnauthorized, "bad signature"},
		{"Missing_signature_is_unauthorized", func() *http.Request {
			r := signedRequest("hooks", []byte(valid), testSecret, now)
			r.Header.Del(HeaderSignature)
			return r
		}, http.StatusUnauthorized, "missing signature"},
		{"Missing_timestamp_is_unauthorized", func() *http.Request {
			r := signedRequest("hooks", []byte(valid), testSecret, now)
			r.Header.Del(HeaderTimestamp)
			return r
		}, http.StatusUnauthorized, "missing signature"},
		{"Stale_timestamp_is_unauthorized", func() *http.Request {
			return signedRequest("hooks", []byte(valid), testSecret, now.Add(-6*time.Minute))
		}, http.StatusUnauthorized, "stale timestamp"},
		{"Future_timestamp_is_unauthorized", func() *http.Request {
			return signedRequest("hooks", []byte(valid), testSecret, now.Add(6*time.Minute))
		}, http.StatusUnauthorized, "stale timestamp"},
		{"Oversized_body_is_too_large", func() *http.Request {
			big := `{"channel":"ops","author":"ada","text":"` + strings.Repeat("a", MaxBodyBytes) + `"}`
			return signedRequest("hooks", []byte(big), testSecret, now)
		}, http.StatusRequestEntityTooLarge, "larger than"},
		{"Malformed_JSON_is_a_bad_request", func() *http.Request {
			return signedRequest("hooks", []byte(`{"channel":"ops",`), testSecret, now)
		}, http.StatusBadRequest, "malformed JSON"},
		{"Trailing_data_is_a_bad_request", func() *http.Request {
			return signedRequest("hooks", []byte(valid+`{}`), testSecret, now)
		}, http.StatusBadRequest, "malformed JSON"},
		{"Unknown_field_is_a_bad_request", func() *http.Request {
			return signedRequest("hooks", []byte(`{"channel":"ops","author":"ada","text":"hi","priority":1}`), testSecret, now)
		}, http.StatusBadRequest, "unknown field"},
		{"Missing_channel_is_a_bad_request", func() *http.Request {
			return signedRequest("hooks", []byte(`{"author":"ada","text":"hi"}`), testSecret, now)
		}, http.StatusBadRequest, "missing channel"},
		{"Missing_author_is_a_bad_request", func() *http.Request {
			return signedRequest("hooks", []byte(`{"channel":"ops","text":"hi"}`), testSecret, now)
		}, http.StatusBadRequest, "missing author"},
		{"Missing_text_is_a_bad_request", func() *http.Request {
			return signedRequest("hooks", []byte(`{"channel":"ops","author":"ada"}`), testSecret, now)
		}, http.StatusBadRequest, "missing text"},
		{"Id_with_a_slash_is_a_bad_request", func() *http.Request {
			return signedRequest("hooks", []byte(`{"id":"a/b","channel":"ops","author":"ada","text":"hi"}`), testSecret, now)
		}, http.StatusBadRequest, "bad id"},
		{"Id_with_a_control_character_is_a_bad_request", func() *http.Request {
			return signedRequest("hooks", []byte(`{"id":"a\u0007","channel":"ops","author":"ada","text":"hi"}`), testSecret, now)
		}, http.StatusBadRequest, "bad id"},
		{"Id_longer_than_200_characters_is_a_bad_request", func() *http.Request {
			return signedRequest("hooks", []byte(`{"id":"`+strings.Repeat("x", 201)+`","channel":"ops","author":"ada","text":"hi"}`), testSecret, now)
		}, http.StatusBadRequest, "bad id"},
		{"NUL_in_the_text_is_a_bad_request_naming_the_field", func() *http.Request {
			return signedRequest("hooks", []byte(`{"id":"m1","channel":"ops","author":"ada","text":"hi\u0000there"}`), testSecret, now)
		}, http.StatusBadRequest, "text contains a NUL character"},
		{"NUL_in_the_author_is_a_bad_request_naming_the_field", func() *http.Request {
			return signedRequest("hooks", []byte(`{"id":"m1","channel":"ops","author":"a\u0000da","text":"hi"}`), testSecret, now)
		}, http.StatusBadRequest, "author contains a NUL character"},
		{"NUL_in_the_thread_is_a_bad_request_naming_the_field", func() *http.Request {
			return signedRequest("hooks", []byte(`{"id":"m1","channel":"ops","thread":"\u0000","author":"ada","text":"hi"}`), testSecret, now)
		}, http.StatusBadRequest, "thread contains a NUL character"},
		{"Invalid_UTF8_in_the_channel_name_is_a_bad_request_naming_the_field", func() *http.Request {
			return signedRequest("hooks", []byte("{\"id\":\"m1\",\"channel\":\"ops\",\"channel_name\":\"op\xffs\",\"author\":\"ada\",\"text\":\"hi\"}"), testSecret, now)
		}, http.StatusBadRequest, "channel_name is not valid UTF-8"},
		{"Invalid_UTF8_in_the_text_is_a_bad_request_naming_the_field", func() *http.Request {
			return signedRequest("hooks", []byte("{\"id\":\"m1\",\"channel\":\"ops\",\"author\":\"ada\",\"text\":\"\xc3\x28\"}"), testSecret, now)
		}, http.StatusBadRequest, "text is not valid UTF-8"},
		{"Unknown_connector_is_not_found", func() *http.Request {
			return signedRequest("nope", []byte(valid), testSecret, now)
		}, http.StatusNotFound, "no webhook connector"},
		{"Connector_of_another_type_is_not_found", func() *http.Request {
			return signedRequest("chat", []byte(valid), testSecret, now)
		}, http.StatusNotFound, "no webhook connector"},
		{"Channel_without_route_is_unprocessable", func() *http.Request {
			return signedRequest("strict", []byte(`{"id":"m1","channel":"random","author":"ada","text":"hi"}`), testSecret, now)
		}, http.StatusUnprocessableEntity, "no agent"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, path := newTestService(t, testConfig(""))
			status, body := post(t, s, tc.request())
			if status != tc.wantStatus {
				t.Fatalf("status = %d, want %d (body %v)", status, tc.wantStatus, body)
			}
			if !strings.Contains(body["error"], tc.wantError) {
				t.Fatalf("error = %q, want it to mention %q", body["error"], tc.wantError)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			for bucket, n := range countEntries(t, path) {
				if n != 0 {
					t.Errorf("%s holds %d entries after a refused request, want 0", bucket, n)
				}
			}
		})
	}
}

func httpBody(s string) *readCloser { return &readCloser{bytes.NewReader([]byte(s))} }

type readCloser struct{ *bytes.Reader }

func (readCloser) Close() error { return nil }

// commitCheckingWriter looks into the store at the moment the status is written.
type commitCheckingWriter struct {
	*httptest.ResponseRecorder
	s          *Service
	inboxAtAck uint32
	acked      bool
}

func (w *commitCheckingWriter) WriteHeader(code int) {
	if !w.acked {
		w.acked = true
		w.inboxAtAck, _ = w.s.store.pendingCounts()
	}
	w.ResponseRecorder.WriteHeader(code)
}

func TestAcceptedMessageIsStoredBeforeTheAcknowledgement(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		body      string
		wantID    string
		wantAgent string
	}{
		{"Message_with_an_id_keeps_it_and_is_routed_by_channel",
			`{"id":"m-1","channel":"ops","channel_name":"#ops","thread":"t9","author":"ada","text":"deploy"}`, "m-1", "ops-agent"},
		{"Message_without_an_id_gets_one_and_the_connector_default_agent",
			`{"channel":"random","author":"ada","text":"hi"}`, "", "helper"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, _ := newTestService(t, testConfig(""))
			w := &commitCheckingWriter{ResponseRecorder: httptest.NewRecorder(), s: s}
			s.Handler().ServeHTTP(w, signedRequest("hooks", []byte(tc.body), testSecret, time.Now()))
			if w.Code != http.StatusAccepted {
				t.Fatalf("status = %d, want 202: %s", w.Code, w.Body)
			}
			if w.inboxAtAck != 1 {
				t.Fatalf("inbox held %d pending messages when 202 was written, want 1", w.inboxAtAck)
			}
			var out struct{ ID string }
			if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil {
				t.Fatal(err)
			}
			if tc.wantID != "" && out.ID != tc.wantID {
				t.Fatalf("id = %q, want %q", out.ID, tc.wantID)
			}
			if err := validID(out.ID); err != nil {
				t.Fatalf("returned id %q is not valid: %v", out.ID, err)
			}
			m, found, err := s.store.message("hooks", out.ID)
			if err != nil || !found {
				t.Fatalf("message %q not in inbox: found=%v err=%v", out.ID, found, err)
			}
			if m.Agent != tc.wantAgent || m.State != statePending || m.ReceivedAt.IsZero() {
				t.Fatalf("stored message = %+v, want pending for agent %s", m, tc.wantAgent)
			}
		})
	}
}

func TestRepeatedIdIsAcknowledgedAndSubmittedOnce(t *testing.T) {
	t.Parallel()
	sub := newCountingSubmitter()
	s, path := newTestService(t, testConfig(""), WithSubmitter(sub))
	runService(t, s)

	body := []byte(`{"id":"dup-1","channel":"ops","author":"ada","text":"once"}`)
	for i := range 3 {
		status, out := post(t, s, signedRequest("hooks", body, testSecret, time.Now()))
		if status != http.StatusAccepted || out["id"] != "dup-1" {
			t.Fatalf("post %d: status %d body %v, want 202 with id dup-1", i+1, status, out)
		}
		eventually(t, "the message is submitted", func() bool {
			m, _, _ := s.store.message("hooks", "dup-1")
			return m.State == stateSubmitted
		})
	}
	// The message left the pending index when it was submitted, and the
	// repeats stored nothing: the forwarder has nothing left to submit.
	if inbox, _ := s.store.pendingCounts(); inbox != 0 {
		t.Fatalf("%d messages pending after the repeats, want 0", inbox)
	}
	if n := sub.callsFor("hooks/dup-1"); n != 1 {
		t.Fatalf("Submit called %d times for hooks/dup-1, want 1", n)
	}
	s.Close()
	if n := countEntries(t, path)["inbox/messages"]; n != 1 {
		t.Fatalf("inbox holds %d messages, want 1", n)
	}
}

func TestReloadTakesNewConnectorsAndSecrets(t *testing.T) {
	t.Parallel()
	s, _ := newTestService(t, testConfig(""))
	body := []byte(`{"id":"r1","channel":"ops","author":"ada","text":"hi"}`)

	if status, _ := post(t, s, signedRequest("late", body, "new-secret", time.Now())); status != http.StatusNotFound {
		t.Fatalf("before reload: status %d, want 404", status)
	}
	cfg := testConfig("")
	cfg.Connectors = append(cfg.Connectors, config.Connector{ID: "late", Type: "webhook", Secret: "new-secret", DefaultAgent: "helper"})
	s.Reload(cfg)
	if status, out := post(t, s, signedRequest("late", body, "new-secret", time.Now())); status != http.StatusAccepted {
		t.Fatalf("after reload: status %d (%v), want 202", status, out)
	}
}

func TestHealthz(t *testing.T) {
	t.Parallel()
	s, _ := newTestService(t, testConfig(""))
	w := httptest.NewRecorder()
	s.Handler().ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	if w.Code != http.StatusOK {
		t.Fatalf("GET /healthz = %d, want 200", w.Code)
	}
}

func TestAReplyPostedAgainAfterALostAnswerCarriesTheSameIdempotencyKey(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var keys []string
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		mu.Lock()
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		first := len(keys) == 1
		mu.Unlock()
		if first {
			// The receiver took the reply but its answer is lost, as when
			// intake dies before marking it delivered: intake posts again.
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				_ = conn.Close()
			}
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(receiver.Close)
	s, _ := newTestService(t, testConfig(receiver.URL))
	runService(t, s)
	if status, out := post(t, s, signedRequest("hooks", []byte(`{"id":"m-1","channel":"ops","author":"ada","text":"status?"}`), testSecret, time.Now())); status != http.StatusAccepted {
		t.Fatalf("post: %d %v", status, out)
	}
	if err := s.Deliver(busapi.ReplyFromWire(map[string]string{"run_id": "run-42", "message_id": "hooks/m-1", "connector": "hooks", "state": "succeeded", "text": "all green"})); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the reply is delivered", func() bool {
		r := outboxEntries(t, s)
		return len(r) == 1 && r[0].State == stateDelivered
	})
	mu.Lock()
	defer mu.Unlock()
	if len(keys) != 2 || keys[0] != "run-42" || keys[1] != "run-42" {
		t.Fatalf("Idempotency-Key of the posts = %q, want the run id on both", keys)
	}
}

func TestAFailedReplyPostIsTheWebhooksLastErrorWithItsTimeUntilOneSucceeds(t *testing.T) {
	t.Parallel()
	var failing atomic.Bool
	failing.Store(true)
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		if failing.Load() {
			http.Error(w, "try later", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(receiver.Close)
	s, _ := newTestService(t, testConfig(receiver.URL))
	runService(t, s)
	if status, out := post(t, s, signedRequest("hooks", []byte(`{"id":"m-1","channel":"ops","author":"ada","text":"status?"}`), testSecret, time.Now())); status != http.StatusAccepted {
		t.Fatalf("post: %d %v", status, out)
	}
	if err := s.Deliver(busapi.ReplyFromWire(map[string]string{"run_id": "run-1", "message_id": "hooks/m-1", "connector": "hooks", "state": "succeeded", "text": "ok"})); err != nil {
		t.Fatal(err)
	}
	hooks := func() connector.Status {
		for _, st := range s.ConnectorStatuses() {
			if st.ID == "hooks" {
				return st.Status
			}
		}
		t.Fatal("no status for connector hooks")
		return connector.Status{}
	}
	eventually(t, "the failed POST is the last error", func() bool { return hooks().LastError != "" })
	if st := hooks(); !strings.Contains(st.LastError, "503") || st.LastErrorAt.IsZero() {
		t.Fatalf("status = %+v, want the 503 with its time", st)
	}
	failing.Store(false)
	eventually(t, "the reply is delivered", func() bool {
		r := outboxEntries(t, s)
		return len(r) == 1 && r[0].State == stateDelivered
	})
	if st := hooks(); st.LastError != "" || !st.LastErrorAt.IsZero() {
		t.Errorf("status after the reply went through = %+v, want no error", st)
	}
}
