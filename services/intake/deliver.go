package intake

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// ErrInvalidReply wraps every reason Deliver refuses a reply.
var ErrInvalidReply = errors.New("invalid reply")

// replyPost is the JSON body posted to a connector's reply_url.
type replyPost struct {
	ID      string `json:"id"`
	RunID   string `json:"run_id"`
	Channel string `json:"channel"`
	Thread  string `json:"thread"`
	Agent   string `json:"agent"`
	State   string `json:"state"`
	Text    string `json:"text"`
	Error   string `json:"error"`
}

// Deliver stores a run's reply in the outbox and returns once it is on disk;
// the deliverer then posts it to the connector. reply has the keys of
// dev.berth.Intake1.Deliver. Delivering a run id again stores nothing and
// returns nil. Refusals wrap ErrInvalidReply.
func (s *Service) Deliver(reply map[string]string) error {
	r, err := s.replyFrom(reply)
	if err != nil {
		return err
	}
	created, err := s.store.addReply(r)
	if err != nil {
		return err
	}
	log := s.log.With("connector", r.Connector, "message_id", r.MessageID, "run_id", r.RunID, "agent", r.Agent)
	if !created {
		log.Info("duplicate reply ignored")
		return nil
	}
	log.Info("reply stored", "run_state", r.RunState)
	s.refreshCounters()
	wake(s.wakeDeliver)
	return nil
}

func (s *Service) replyFrom(in map[string]string) (outboxEntry, error) {
	for _, k := range []string{"run_id", "message_id", "connector"} {
		if in[k] == "" {
			return outboxEntry{}, fmt.Errorf("%w: missing %s", ErrInvalidReply, k)
		}
	}
	if err := validID(in["run_id"]); err != nil {
		return outboxEntry{}, fmt.Errorf("%w: bad run_id: %v", ErrInvalidReply, err)
	}
	if _, ok := s.config().Connector(in["connector"]); !ok {
		return outboxEntry{}, fmt.Errorf("%w: unknown connector %q", ErrInvalidReply, in["connector"])
	}
	r := outboxEntry{
		RunID:     in["run_id"],
		MessageID: in["message_id"],
		Connector: in["connector"],
		Agent:     in["agent"],
		Channel:   in["channel"],
		Thread:    in["thread"],
		RunState:  in["state"],
		Text:      in["text"],
		Error:     in["error"],
	}
	// The scheduler knows messages by "<connector>/<id>"; the platform by id.
	r.MessageID = strings.TrimPrefix(r.MessageID, r.Connector+"/")
	if r.Channel == "" || r.Agent == "" {
		if m, found, err := s.store.message(r.Connector, r.MessageID); err == nil && found {
			r.Channel = cmp.Or(r.Channel, m.Channel)
			r.Thread = cmp.Or(r.Thread, m.Thread)
			r.Agent = cmp.Or(r.Agent, m.Agent)
		}
	}
	return r, nil
}

func (s *Service) deliverLoop(ctx context.Context) {
	runLoop(ctx, s.wakeDeliver, s.deliverPass)
}

// deliverPass posts every pending reply that is due and returns when the
// next one is due.
func (s *Service) deliverPass(ctx context.Context) (time.Duration, bool) {
	pending, err := s.store.pendingReplies()
	if err != nil {
		s.log.Error("cannot deliver replies", "err", err)
		return s.backoff.max, true
	}
	var next time.Time
	for _, r := range pending {
		if ctx.Err() != nil {
			return 0, false
		}
		if s.now().Before(r.NextAttempt) {
			next = earliest(next, r.NextAttempt)
			continue
		}
		if due, retry := s.deliver(ctx, r); retry {
			next = earliest(next, due)
		}
	}
	if next.IsZero() {
		return 0, false
	}
	return max(time.Until(next), 0), true
}

// deliver posts one reply and reports when to retry it if that failed.
func (s *Service) deliver(ctx context.Context, r outboxEntry) (time.Time, bool) {
	log := s.log.With("connector", r.Connector, "message_id", r.MessageID, "run_id", r.RunID, "agent", r.Agent)
	err := s.post(ctx, r)
	if errors.Is(err, errNoReplyURL) {
		log.Warn("connector has no reply_url; its replies are dropped")
		err = nil
	}
	if err != nil {
		var due time.Time
		if serr := s.store.recordDeliveryFailure(r.RunID, err, func(attempts int) time.Time {
			due = s.now().Add(s.backoff.delay(attempts))
			return due
		}); serr != nil {
			log.Error("cannot record failed delivery", "err", serr)
			due = s.now().Add(s.backoff.max)
		}
		log.Warn("reply not delivered; will retry", "attempts", r.Attempts+1, "retry_at", due, "err", err)
		return due, true
	}
	if err := s.store.markDelivered(r.RunID, s.now().UTC()); err != nil {
		log.Error("cannot record delivered reply", "err", err)
		return s.now().Add(s.backoff.max), true
	}
	log.Info("reply delivered", "attempts", r.Attempts+1)
	s.refreshCounters()
	return time.Time{}, false
}

var errNoReplyURL = errors.New("connector has no reply_url")

// post sends r to its connector's reply_url, signed like incoming webhooks.
func (s *Service) post(ctx context.Context, r outboxEntry) error {
	cfg := s.config()
	conn, ok := cfg.Connector(r.Connector)
	if !ok {
		return fmt.Errorf("connector %q is no longer configured", r.Connector)
	}
	if conn.ReplyURL == "" {
		return errNoReplyURL
	}
	secret, err := cfg.ConnectorSecret(r.Connector)
	if err != nil {
		return fmt.Errorf("cannot read connector secret: %w", err)
	}
	body, err := json.Marshal(replyPost{
		ID: r.MessageID, RunID: r.RunID, Channel: r.Channel, Thread: r.Thread,
		Agent: r.Agent, State: r.RunState, Text: r.Text, Error: r.Error,
	})
	if err != nil {
		return fmt.Errorf("cannot encode reply: %w", err)
	}
	// Like Submit, a post in flight finishes even when the service stops.
	callCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.callTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(callCtx, http.MethodPost, conn.ReplyURL, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("cannot build reply request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "berth-intake")
	SetSignature(req.Header, secret, s.now(), body)
	resp, err := s.httpClient.Do(req)
	if err != nil {
		// The URL may carry a token of the platform's; keep it out of logs.
		if uerr, ok := errors.AsType[*url.Error](err); ok {
			err = uerr.Err
		}
		return fmt.Errorf("cannot post reply: %w", err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("reply_url answered %s", resp.Status)
	}
	return nil
}
