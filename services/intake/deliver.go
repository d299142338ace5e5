package intake

import (
	"bytes"
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"strings"
	"time"

	"go.opentelemetry.io/otel/codes"

	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/tracing"
	"github.com/berth-dev/berth/services/intake/connector"
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
	// Files are the reply's uploads, each with its bytes in base64; absent
	// for a reply without files.
	Files []replyPostFile `json:"files,omitempty"`
	// Approval is the question of an approval's ask (absent otherwise):
	// the receiver answers with a message "approve ID", "approve ID for
	// conversation" or "deny ID" from an author [[approvers]] names.
	Approval *busapi.Question `json:"approval,omitempty"`
}

// replyPostFile is one file of a reply post.
type replyPostFile struct {
	Name    string `json:"name"`
	Type    string `json:"type"`
	Size    int64  `json:"size"`
	Caption string `json:"caption,omitempty"`
	Base64  string `json:"base64"`
}

// Deliver stores a run's reply in the outbox and returns once it is on disk,
// with a copy of each of its files (reply.Files, read from their start and
// left open for the caller to close); the deliverer then posts it to the
// connector. Delivering a run id again stores nothing and returns nil.
// Refusals wrap ErrInvalidReply.
func (s *Service) Deliver(reply busapi.Reply) error {
	r, err := s.replyFrom(reply)
	if err != nil {
		return err
	}
	log := s.log.With("connector", r.Connector, "message_id", r.MessageID, "run_id", r.RunID, "agent", r.Agent)
	if len(reply.Files) > 0 {
		if _, found, err := s.store.reply(r.RunID); err != nil || found {
			if found {
				log.Info("duplicate reply ignored")
			}
			return err
		}
		if r.FilesDir, r.Files, err = s.replyFiles.save(r.RunID, reply.Files); err != nil {
			return err
		}
	}
	created, err := s.store.addReply(r)
	if err != nil || !created {
		if rerr := s.replyFiles.remove(r.FilesDir); rerr != nil {
			log.Error("cannot remove the files of a reply not stored", "err", rerr)
		}
	}
	if err != nil {
		return err
	}
	if !created {
		log.Info("duplicate reply ignored")
		return nil
	}
	log.Info("reply stored", "run_state", r.RunState, "files", len(r.Files))
	s.refreshCounters()
	s.stopTyping(busapi.MessageKey(r.Connector, r.MessageID))
	s.pokeDeliver(r.Connector)
	return nil
}

// pokeDeliver wakes the reply worker of a connector (once Run runs).
func (s *Service) pokeDeliver(connectorID string) {
	if l := s.deliverOn.Load(); l != nil {
		l.poke(connectorID)
	}
}

// replyMeta is what a reply to m carries back to its connector: the
// message's Meta, plus its server under connector.MetaServer.
func replyMeta(m inboxEntry) map[string]string {
	if len(m.Meta) == 0 && m.Server == "" {
		return nil
	}
	meta := maps.Clone(m.Meta)
	if meta == nil {
		meta = map[string]string{}
	}
	if _, ok := meta[connector.MetaServer]; !ok && m.Server != "" {
		meta[connector.MetaServer] = m.Server
	}
	return meta
}

func (s *Service) replyFrom(in busapi.Reply) (outboxEntry, error) {
	for _, f := range []struct{ key, value string }{{"run_id", in.RunID}, {"message_id", in.MessageID}, {"connector", in.Connector}} {
		if f.value == "" {
			return outboxEntry{}, fmt.Errorf("%w: missing %s", ErrInvalidReply, f.key)
		}
	}
	if err := validID(in.RunID); err != nil {
		return outboxEntry{}, fmt.Errorf("%w: bad run_id: %v", ErrInvalidReply, err)
	}
	if len(in.Files) > busapi.MaxFiles {
		return outboxEntry{}, fmt.Errorf("%w: %d files, at most %d", ErrInvalidReply, len(in.Files), busapi.MaxFiles)
	}
	for _, f := range in.Files {
		if name, err := busapi.CleanFileName(f.Name); err != nil || name != f.Name || f.Size < 0 || f.Open == nil {
			return outboxEntry{}, fmt.Errorf("%w: file %q is not a plain file name with its size and bytes", ErrInvalidReply, f.Name)
		}
	}
	if _, ok := s.config().Connector(in.Connector); !ok {
		return outboxEntry{}, fmt.Errorf("%w: unknown connector %q", ErrInvalidReply, in.Connector)
	}
	r := outboxEntry{
		RunID:     in.RunID,
		MessageID: in.MessageID,
		Connector: in.Connector,
		Agent:     in.Agent,
		Channel:   in.Channel,
		Thread:    in.Thread,
		RunState:  in.State,
		Text:      in.Text,
		Error:     in.Error,

		Traceparent: validTraceparent(in.Traceparent),
		Question:    in.Question,
	}
	m, found, err := s.store.message(r.Connector, r.MessageID)
	if err != nil {
		return outboxEntry{}, err
	}
	if found {
		r.Channel = cmp.Or(r.Channel, m.Channel)
		r.Thread = cmp.Or(r.Thread, m.Thread)
		r.Agent = cmp.Or(r.Agent, m.Agent)
		r.Meta = replyMeta(m)
	}
	return r, nil
}

// deliverPass is the deliver loop's pass: it makes sure every connector
// with pending replies has its worker, and wakes them. It also publishes the
// connectors' status. It does no I/O but reading the pending index, so it
// passes even while a platform hangs.
func (s *Service) deliverPass(context.Context) (time.Duration, bool) {
	s.refreshConnectors()
	l := s.deliverOn.Load()
	if l == nil {
		return 0, false
	}
	connectors, err := s.store.connectorsWithPending(outboxQueue)
	if err != nil {
		s.log.Error("cannot deliver replies", "err", err)
		return s.retryDelay.Max, true
	}
	for _, c := range connectors {
		l.poke(c)
	}
	return 0, false
}

// deliverConnector sends every pending reply of one connector that is due,
// oldest first, and returns when the next one is due.
func (s *Service) deliverConnector(ctx context.Context, connectorID string) (time.Duration, bool) {
	pending, err := s.store.pendingRepliesOf(connectorID)
	if err != nil {
		s.log.Error("cannot deliver replies", "connector", connectorID, "err", err)
		return s.retryDelay.Max, true
	}
	var next time.Time
	for _, r := range pending {
		if ctx.Err() != nil {
			return 0, false
		}
		if s.clock.Now().Before(r.NextAttempt) {
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
	return max(next.Sub(s.clock.Now()), 0), true
}

// deliver sends one reply through its connector and records the outcome: a
// *connector.PermanentError marks it failed with the platform's reason, a
// *connector.RetryAfterError retries after the wait the platform asked for,
// any other error after a capped back-off. It reports when to retry.
func (s *Service) deliver(ctx context.Context, r outboxEntry) (time.Time, bool) {
	log := s.log.With("connector", r.Connector, "message_id", r.MessageID, "run_id", r.RunID, "agent", r.Agent)
	ctx, span := startDeliver(ctx, r)
	err := s.send(ctx, r)
	if errors.Is(err, errNoReplyURL) {
		log.Warn("connector has no reply_url; its replies are dropped")
		err = nil
	}
	if err != nil {
		span.SetStatus(codes.Error, "the reply was not sent")
	}
	span.End()
	now := s.clock.Now()
	if err != nil && connector.IsPermanent(err) {
		if serr := s.store.markFailed(r.RunID, err.Error(), now); serr != nil {
			log.Error("cannot record failed reply", "err", serr)
			return now.Add(s.retryDelay.Max), true
		}
		log.Error("platform refused the reply for good; it is marked failed", "attempts", r.Attempts+1, "err", err)
		s.removeReplyFiles(r, log)
		s.refreshCounters()
		return time.Time{}, false
	}
	if err != nil {
		delay := s.retryDelay.Delay(r.Attempts + 1)
		if after, ok := connector.RetryAfter(err); ok {
			delay = max(after, 0)
		}
		due := now.Add(delay)
		if serr := s.store.recordDeliveryFailure(r.RunID, err, now, due); serr != nil {
			log.Error("cannot record failed delivery", "err", serr)
			due = now.Add(s.retryDelay.Max)
		}
		log.Warn("reply not delivered; will retry", "attempts", r.Attempts+1, "retry_at", due, "err", err)
		return due, true
	}
	s.finishProgress(r)
	if err := s.store.markDelivered(r.RunID, now); err != nil {
		log.Error("cannot record delivered reply", "err", err)
		return now.Add(s.retryDelay.Max), true
	}
	log.Info("reply delivered", "attempts", r.Attempts+1, "files", len(r.Files))
	s.removeReplyFiles(r, log)
	s.refreshCounters()
	return time.Time{}, false
}

// send hands r to its connector: the webhook type posts it to reply_url,
// the others get a connector.Reply. Every call has a deadline.
func (s *Service) send(ctx context.Context, r outboxEntry) error {
	rc, ok := s.connectorByID(r.Connector)
	if !ok {
		return fmt.Errorf("connector %q is no longer configured", r.Connector)
	}
	if rc.conn == nil {
		return fmt.Errorf("connector %q is not running: %s", r.Connector, rc.buildErr)
	}
	if wc, ok := rc.conn.(*webhookConnector); ok {
		err := s.post(ctx, r)
		wc.noteError(err)
		return err
	}
	reply := connectorReply(r)
	reply.Files = s.replyFiles.files(r.FilesDir, r.Files)
	if rp, ok := rc.conn.(connector.RepostChecker); ok && rp.ChecksReposts() && !reply.Retry {
		// Durably before the post: a crash after it makes the next attempt
		// a Retry, which looks for the post instead of making it twice.
		if err := s.store.markAttempted(r.RunID, s.clock.Now()); err != nil {
			return err
		}
	}
	// Like Submit, a send in flight finishes even when the service stops.
	// Uploads get a second more per MiB.
	timeout := s.callTimeout
	for _, f := range reply.Files {
		timeout += time.Duration(f.Size>>20) * time.Second
	}
	callCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	return rc.conn.Send(callCtx, reply)
}

// connectorReply is the Reply a connector posts for r. A failed run's reply
// says so, with the error the scheduler gave.
func connectorReply(r outboxEntry) connector.Reply {
	failed := r.RunState != "" && r.RunState != "succeeded"
	text := r.Text
	if failed && r.Error != "" {
		if text == "" {
			text = "Sorry, the agent could not answer"
		}
		text = strings.TrimRight(text, ". ") + ": " + r.Error
	}
	return connector.Reply{
		RunID:     r.RunID,
		MessageID: r.MessageID,
		Channel:   r.Channel,
		Thread:    r.Thread,
		Text:      text,
		Failed:    failed,
		Meta:      maps.Clone(r.Meta),
		// An earlier attempt that failed, or that began and was never marked
		// delivered (a crash), may have posted it.
		Retry:    r.Attempts > 0 || !r.AttemptedAt.IsZero(),
		Question: r.Question,
	}
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
	files, err := postFiles(s.replyFiles.files(r.FilesDir, r.Files))
	if err != nil {
		return err
	}
	body, err := json.Marshal(replyPost{
		ID: r.MessageID, RunID: r.RunID, Channel: r.Channel, Thread: r.Thread,
		Agent: r.Agent, State: r.RunState, Text: r.Text, Error: r.Error, Files: files,
		Approval: r.Question,
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
	// At-least-once: a retry after a lost answer or a crash posts the same
	// reply again with the same key, and the receiver drops the repeat.
	req.Header.Set("Idempotency-Key", r.RunID)
	if tp := tracing.Traceparent(ctx); tp != "" {
		req.Header.Set("Traceparent", tp) // the send's span, for the receiver's trace
	}
	SetSignature(req.Header, secret, s.clock.Now(), body)
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

// removeReplyFiles deletes a done reply's files; what a failure leaves, the
// retention pass sweeps.
func (s *Service) removeReplyFiles(r outboxEntry, log *slog.Logger) {
	if err := s.replyFiles.remove(r.FilesDir); err != nil {
		log.Warn("cannot remove the files of a finished reply; the retention pass will", "err", err)
	}
}

// postFiles are a reply post's files, their bytes in base64. A webhook has
// no upload limit of its own: the scheduler's max_reply_file_bytes and
// max_reply_files_bytes bound what is posted.
func postFiles(files []connector.File) ([]replyPostFile, error) {
	out := make([]replyPostFile, 0, len(files))
	for _, f := range files {
		data, err := readFileBytes(f)
		if err != nil {
			return nil, err
		}
		out = append(out, replyPostFile{Name: f.Name, Type: f.Type, Size: f.Size, Caption: f.Caption, Base64: base64.StdEncoding.EncodeToString(data)})
	}
	return out, nil
}

func readFileBytes(f connector.File) ([]byte, error) {
	r, err := f.Open()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	data, err := io.ReadAll(io.LimitReader(r, f.Size+1))
	if err != nil {
		return nil, fmt.Errorf("cannot read the reply's file %s: %w", f.Name, err)
	}
	if int64(len(data)) != f.Size {
		return nil, fmt.Errorf("the reply's file %s has %d bytes, not %d", f.Name, len(data), f.Size)
	}
	return data, nil
}
