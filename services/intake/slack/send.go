package slack

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"time"

	slackapi "github.com/slack-go/slack"

	"github.com/berth-dev/berth/services/intake/connector"
)

// defaultRetryAfter is the wait assumed for a 429 without Retry-After.
const defaultRetryAfter = 30 * time.Second

// maxInlineRetries bounds the 429 waits one chunk sleeps inside Send.
const maxInlineRetries = 3

// maxProgress bounds the replies whose partial progress is remembered.
const maxProgress = 1024

// permanentRefusals are chat.postMessage errors that will not change by
// retrying: the channel is gone, the bot was removed, the token revoked,
// the message itself is refused.
var permanentRefusals = map[string]bool{
	"channel_not_found":                        true,
	"not_in_channel":                           true,
	"is_archived":                              true,
	"account_inactive":                         true,
	"invalid_auth":                             true,
	"not_authed":                               true,
	"token_revoked":                            true,
	"token_expired":                            true,
	"no_permission":                            true,
	"missing_scope":                            true,
	"not_allowed_token_type":                   true,
	"access_denied":                            true,
	"ekm_access_denied":                        true,
	"restricted_action":                        true,
	"restricted_action_read_only_channel":      true,
	"restricted_action_thread_only_channel":    true,
	"restricted_action_non_threadable_channel": true,
	"team_access_not_granted":                  true,
	"cannot_reply_to_message":                  true,
	"msg_too_long":                             true,
	"no_text":                                  true,
	"invalid_blocks":                           true,
	"as_user_not_supported":                    true,
	"team_not_found":                           true,
	"user_is_bot":                              true,
}

// sendProgress remembers how many chunks of a reply were posted, so that a
// reply sent again after a RetryAfterError or a transient failure does not
// post its first chunks twice (kept in memory: after a restart a reply may
// repeat its first chunks, never lose one).
type sendProgress struct {
	digest [32]byte
	sent   int
	files  int // files shared, once every chunk is posted
}

// Send posts r in its thread, in chunks of at most MessageLimit characters.
func (c *Connector) Send(ctx context.Context, r connector.Reply) error {
	err := c.send(ctx, r)
	if err != nil {
		c.status.Failed(fmt.Errorf("cannot post a reply: %w", err))
	} else {
		c.status.Healthy()
	}
	return err
}

func (c *Connector) send(ctx context.Context, r connector.Reply) error {
	if r.Channel == "" {
		return &connector.PermanentError{Reason: "the reply has no Slack channel"}
	}
	if c.decideQuestion(ctx, r) {
		return nil
	}
	files, notes := connector.FitFiles(r.Files, fileLimits)
	chunks := connector.Split(connector.WithNotes(r.Text, notes), MessageLimit)
	if len(chunks) == 0 {
		chunks = []string{"(empty reply)"}
	}
	key := r.RunID + "\x00" + r.MessageID
	digest := sha256.Sum256([]byte(r.Channel + "\x00" + r.Thread + "\x00" + r.Text))
	c.mu.Lock()
	start, startFiles := 0, 0
	if p, ok := c.progress[key]; ok && p.digest == digest {
		start, startFiles = p.sent, p.files
	}
	c.mu.Unlock()
	var posted map[int]bool
	if r.Retry && start == 0 {
		var err error
		if posted, err = c.postedChunks(ctx, r, len(chunks)); err != nil {
			return err
		}
		if len(posted) > 0 {
			c.log.Info("found chunks an earlier attempt posted; they are not posted again",
				"run_id", r.RunID, "message_id", r.MessageID, "found", len(posted), "chunks", len(chunks))
		}
	}
	for i := start; i < len(chunks); i++ {
		if posted[i+1] {
			continue
		}
		var extra []slackapi.MsgOption
		if r.Question != nil && i == len(chunks)-1 {
			extra = append(extra, questionBlocks(chunks[i], r.Question))
		}
		if err := c.post(ctx, r.Channel, r.Thread, chunks[i], replyMetadata(r.RunID, i+1, len(chunks)), extra...); err != nil {
			c.mu.Lock()
			if connector.IsPermanent(err) {
				delete(c.progress, key)
			} else {
				if len(c.progress) >= maxProgress {
					clear(c.progress) // replies intake gave up on; worst case a chunk repeats
				}
				c.progress[key] = sendProgress{digest: digest, sent: i}
			}
			c.mu.Unlock()
			c.log.Warn("cannot post a reply to Slack", "run_id", r.RunID, "message_id", r.MessageID,
				"chunk", i+1, "chunks", len(chunks), "error", err)
			return err
		}
	}
	for i := startFiles; i < len(files); i++ {
		err := c.shareFile(ctx, r.Channel, r.Thread, files[i])
		if pe, ok := errors.AsType[*connector.PermanentError](err); ok {
			// The text is posted; the file alone is refused: say so there.
			c.log.Warn("Slack refused a reply's file; the reply says so", "run_id", r.RunID, "file", files[i].Name, "error", err)
			err = c.post(ctx, r.Channel, r.Thread, connector.WithNotes("", []string{files[i].Name + " was not sent: " + pe.Reason}), replyMetadata(r.RunID, len(chunks), len(chunks)))
		}
		if err != nil {
			c.mu.Lock()
			if connector.IsPermanent(err) {
				delete(c.progress, key)
			} else {
				c.progress[key] = sendProgress{digest: digest, sent: len(chunks), files: i}
			}
			c.mu.Unlock()
			c.log.Warn("cannot upload a reply's file to Slack", "run_id", r.RunID, "message_id", r.MessageID,
				"file", i+1, "files", len(files), "error", err)
			return err
		}
	}
	c.mu.Lock()
	delete(c.progress, key)
	c.mu.Unlock()
	return nil
}

// fileLimits are what Slack takes: files up to 1 GB
// (methods/files.getUploadURLExternal: file_upload_size_restricted beyond
// a workspace's own limit), never empty (length must be above 0).
var fileLimits = connector.FileLimits{Platform: "Slack", MaxFileBytes: 1 << 30, RefuseEmpty: true}

// shareFile uploads one file with the files upload v2 flow and shares it in
// the reply's thread, its caption as the message that introduces it.
func (c *Connector) shareFile(ctx context.Context, channel, thread string, f connector.File) error {
	upload, err := c.api.GetUploadURLExternalContext(ctx, slackapi.GetUploadURLExternalParameters{FileName: f.Name, FileSize: int(f.Size)})
	if err != nil {
		return c.classifyFiles("files.getUploadURLExternal", err)
	}
	body, err := f.Open()
	if err != nil {
		return err
	}
	defer body.Close()
	if err := c.api.UploadToURL(ctx, slackapi.UploadToURLParameters{UploadURL: upload.UploadURL, Reader: body, Filename: f.Name}); err != nil {
		return c.classifyFiles("the upload", err)
	}
	_, err = c.api.CompleteUploadExternalContext(ctx, slackapi.CompleteUploadExternalParameters{
		Files: []slackapi.FileSummary{{ID: upload.FileID, Title: f.Name}}, Channel: channel, ThreadTimestamp: thread, InitialComment: f.Caption,
	})
	if err != nil {
		return c.classifyFiles("files.completeUploadExternal", err)
	}
	return nil
}

// classifyFiles is classify for the calls of an upload, whose rate limits
// come back as errors rather than waits.
func (c *Connector) classifyFiles(call string, err error) error {
	var rl *slackapi.RateLimitedError
	if errors.As(err, &rl) {
		return &connector.RetryAfterError{After: max(rl.RetryAfter, time.Second), Err: errors.New("Slack rate-limited " + call)}
	}
	var se slackapi.SlackErrorResponse
	if errors.As(err, &se) && (se.Err == "file_uploads_disabled" || se.Err == "file_upload_size_restricted" || se.Err == "file_type_not_allowed" || se.Err == "file_uploads_except_images_disabled") {
		return &connector.PermanentError{Reason: "Slack refused the reply's file: " + se.Err}
	}
	return c.classify(err)
}

// post sends one chunk, sleeping through short 429 waits.
func (c *Connector) post(ctx context.Context, channel, thread, text string, meta slackapi.SlackMetadata, extra ...slackapi.MsgOption) error {
	for tries := 0; ; tries++ {
		err := c.postOnce(ctx, channel, thread, text, meta, extra...)
		var rl *slackapi.RateLimitedError
		switch {
		case err == nil:
			return nil
		case errors.As(err, &rl):
			wait := rl.RetryAfter
			if wait <= 0 {
				wait = time.Second
			}
			if wait > c.o.MaxInlineWait || tries >= maxInlineRetries {
				return &connector.RetryAfterError{After: wait, Err: errors.New("Slack rate-limited chat.postMessage")}
			}
			c.log.Info("Slack rate-limited chat.postMessage; waiting", "retry_after", wait)
			select {
			case <-ctx.Done():
				return fmt.Errorf("cannot post to Slack: %w", ctx.Err())
			case <-c.clock.After(wait):
			}
		default:
			return c.classify(err)
		}
	}
}

func (c *Connector) postOnce(ctx context.Context, channel, thread, text string, meta slackapi.SlackMetadata, extra ...slackapi.MsgOption) error {
	ctx, cancel := context.WithTimeout(ctx, c.o.RequestTimeout)
	defer cancel()
	opts := append([]slackapi.MsgOption{slackapi.MsgOptionText(text, false), slackapi.MsgOptionMetadata(meta)}, extra...)
	if thread != "" {
		opts = append(opts, slackapi.MsgOptionTS(thread))
	}
	_, _, err := c.api.PostMessageContext(ctx, channel, opts...)
	return err
}

// classify turns a chat.postMessage failure into intake's outcomes.
func (c *Connector) classify(err error) error {
	var se slackapi.SlackErrorResponse
	if errors.As(err, &se) {
		if permanentRefusals[se.Err] {
			return &connector.PermanentError{Reason: "Slack refused the reply: " + se.Err}
		}
		if se.Err == "ratelimited" || se.Err == "rate_limited" {
			return &connector.RetryAfterError{After: defaultRetryAfter, Err: errors.New("Slack rate-limited chat.postMessage: " + se.Err)}
		}
		return fmt.Errorf("Slack failed chat.postMessage: %s", se.Err)
	}
	var sc slackapi.StatusCodeError
	if errors.As(err, &sc) {
		switch {
		case sc.Code == http.StatusTooManyRequests:
			return &connector.RetryAfterError{After: defaultRetryAfter, Err: errors.New("Slack answered 429 without Retry-After")}
		case sc.Code >= 400 && sc.Code < 500 && sc.Code != http.StatusRequestTimeout:
			return &connector.PermanentError{Reason: fmt.Sprintf("Slack refused the reply: HTTP %d", sc.Code)}
		}
		return fmt.Errorf("Slack failed chat.postMessage: HTTP %d", sc.Code)
	}
	return fmt.Errorf("cannot post to Slack: %s", c.errText(err))
}

// ReplyEventType is the metadata event type of every chunk berth posts; its
// payload names the run and the chunk ({"run_id", "chunk", "chunks"}).
const ReplyEventType = "berth_reply"

// historyPages bounds the pages (of historyPageSize messages) a retry reads
// looking for an earlier attempt's chunks.
const (
	historyPages    = 5
	historyPageSize = 200
)

func replyMetadata(runID string, chunk, chunks int) slackapi.SlackMetadata {
	return slackapi.SlackMetadata{EventType: ReplyEventType, EventPayload: map[string]any{
		"run_id": runID, "chunk": chunk, "chunks": chunks,
	}}
}

// ChecksReposts reports that a Reply with Retry set is first looked for in
// the thread's history (connector.RepostChecker).
func (c *Connector) ChecksReposts() bool { return true }

// postedChunks returns the chunks (numbered from 1) of r that an earlier
// attempt already posted: the bot's messages in r's thread (or the channel's
// recent history outside a thread) whose metadata names r's run. A history
// Slack will not show (missing scope, thread gone) counts as nothing posted:
// the reply is posted again rather than lost.
func (c *Connector) postedChunks(ctx context.Context, r connector.Reply, chunks int) (map[int]bool, error) {
	self, err := c.identity(ctx)
	if err != nil {
		return nil, err
	}
	posted := map[int]bool{}
	cursor := ""
	for range historyPages {
		msgs, next, err := c.historyPage(ctx, r.Channel, r.Thread, cursor)
		var se slackapi.SlackErrorResponse
		if errors.As(err, &se) {
			c.log.Warn("cannot read the Slack thread to find an earlier attempt of the reply; posting it again",
				"run_id", r.RunID, "message_id", r.MessageID, "error", se.Err, "hint", "the bot needs the channels:history, groups:history, im:history and mpim:history scopes")
			return posted, nil
		}
		var rl *slackapi.RateLimitedError
		if errors.As(err, &rl) {
			return nil, &connector.RetryAfterError{After: max(rl.RetryAfter, time.Second), Err: errors.New("Slack rate-limited reading the thread")}
		}
		if err != nil {
			// Not knowing what is posted, wait rather than post twice.
			return nil, fmt.Errorf("cannot read the Slack thread to find an earlier attempt of the reply: %s", c.errText(err))
		}
		for _, m := range msgs {
			if m.User != self.UserID && (self.BotID == "" || m.BotID != self.BotID) {
				continue
			}
			p := m.Metadata.EventPayload
			if m.Metadata.EventType != ReplyEventType || p["run_id"] != r.RunID {
				continue
			}
			if n, ok := p["chunk"].(float64); ok && int(n) >= 1 && int(n) <= chunks {
				posted[int(n)] = true
			}
		}
		if next == "" || len(posted) == chunks {
			break
		}
		cursor = next
	}
	return posted, nil
}

// historyPage reads one page of the thread (conversations.replies) or, for
// a reply outside a thread, of the channel's recent history
// (conversations.history), with message metadata.
func (c *Connector) historyPage(ctx context.Context, channel, thread, cursor string) ([]slackapi.Message, string, error) {
	ctx, cancel := context.WithTimeout(ctx, c.o.RequestTimeout)
	defer cancel()
	if thread != "" {
		msgs, _, next, err := c.api.GetConversationRepliesContext(ctx, &slackapi.GetConversationRepliesParameters{
			ChannelID: channel, Timestamp: thread, Cursor: cursor, Limit: historyPageSize, IncludeAllMetadata: true,
		})
		return msgs, next, err
	}
	resp, err := c.api.GetConversationHistoryContext(ctx, &slackapi.GetConversationHistoryParameters{
		ChannelID: channel, Cursor: cursor, Limit: historyPageSize, IncludeAllMetadata: true,
	})
	if err != nil {
		return nil, "", err
	}
	return resp.Messages, resp.ResponseMetaData.NextCursor, nil
}
