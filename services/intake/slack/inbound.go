package slack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/berth-dev/berth/services/intake/connector"
)

// callback is the outer Events API payload: the body of an HTTP request in
// events mode, the "payload" of an events_api envelope in socket mode.
type callback struct {
	Type      string          `json:"type"` // event_callback, url_verification, app_rate_limited
	TeamID    string          `json:"team_id"`
	EventID   string          `json:"event_id"`
	Event     json.RawMessage `json:"event"`
	Challenge string          `json:"challenge"`
}

// event is the inner event: the fields of "message" and "app_mention" we use.
type event struct {
	Type        string `json:"type"`
	Subtype     string `json:"subtype"`
	User        string `json:"user"`
	BotID       string `json:"bot_id"`
	Text        string `json:"text"`
	TS          string `json:"ts"`
	ThreadTS    string `json:"thread_ts"`
	Channel     string `json:"channel"`
	ChannelType string `json:"channel_type"`
	Team        string `json:"team"`
	// Files are the files shared with the message (subtype file_share).
	Files []eventFile `json:"files"`
}

// newMessageSubtypes are the message subtypes that are a user's new message;
// every other subtype (message_changed, message_deleted, channel_join, ...)
// is ignored.
var newMessageSubtypes = map[string]bool{
	"":                 true,
	"thread_broadcast": true,
	"file_share":       true,
	"me_message":       true,
	"bot_message":      true, // handed on only with AllowBots
}

// errBadPayload marks a payload that is not an Events API callback: it is
// logged and acknowledged (its redelivery would be as bad), never stored.
var errBadPayload = errors.New("malformed Events API payload")

// deliver turns one Events API callback into at most one Message and hands
// it to sink. It returns nil when the payload was stored or ignored (the
// platform may be acknowledged), an error wrapping errBadPayload for bad
// input, and any other error when Accept failed (do not acknowledge).
func (c *Connector) deliver(ctx context.Context, sink connector.Sink, cb callback, via string) error {
	c.sawEvent()
	if cb.Type != "event_callback" {
		c.log.Info("ignored Slack payload", "type", cb.Type, "via", via)
		return nil
	}
	var ev event
	if err := json.Unmarshal(cb.Event, &ev); err != nil || ev.Type == "" {
		return fmt.Errorf("%w: event is not a JSON object with a type", errBadPayload)
	}
	self, err := c.identity(ctx)
	if err != nil {
		return err
	}
	m, why := c.message(cb, ev, self)
	if why != "" {
		c.log.Debug("ignored Slack event", "type", ev.Type, "subtype", ev.Subtype, "reason", why, "via", via)
		return nil
	}
	if m.Meta["channel_type"] != "im" && !strings.HasPrefix(m.Channel, "D") {
		m.ChannelName = c.channelName(ctx, m.Channel)
	}
	if _, ok := connector.ParseDecision(m.Text); ok && m.AuthorID != "" {
		// A typed decision: its author's groups count as a click's do.
		m.AuthorGroups = c.userGroups(ctx, m.AuthorID)
	}
	if err := sink.Accept(ctx, m); err != nil {
		c.log.Warn("intake did not accept the Slack message; Slack will deliver it again",
			"message_id", m.ID, "error", c.errText(err))
		return fmt.Errorf("cannot hand the message to intake: %w", err)
	}
	c.status.Healthy()
	c.log.Debug("accepted Slack message", "message_id", m.ID, "via", via)
	return nil
}

// message maps ev to a Message, or says why it is ignored.
func (c *Connector) message(cb callback, ev event, self identity) (connector.Message, string) {
	switch ev.Type {
	case "message", "app_mention":
	default:
		return connector.Message{}, "not a message event"
	}
	if ev.Type == "message" && !newMessageSubtypes[ev.Subtype] {
		return connector.Message{}, "not a new message"
	}
	if ev.Channel == "" || ev.TS == "" {
		return connector.Message{}, "no channel or ts"
	}
	if (self.UserID != "" && ev.User == self.UserID) || (self.BotID != "" && ev.BotID == self.BotID) {
		return connector.Message{}, "the bot's own message"
	}
	isBot := ev.BotID != "" || ev.Subtype == "bot_message"
	if isBot && !c.o.AllowBots {
		return connector.Message{}, "a bot's message"
	}
	if !isBot && ev.User == "" {
		return connector.Message{}, "no author"
	}
	mention := "<@" + self.UserID + ">"
	// A decision on one of berth's approvals is for the bot, mention or not.
	_, decision := connector.ParseDecision(ev.Text)
	if c.o.Trigger == TriggerMention && ev.Type == "message" && !decision &&
		ev.ChannelType != "im" && (self.UserID == "" || !strings.Contains(ev.Text, mention)) {
		return connector.Message{}, "no mention of the bot"
	}
	thread := ev.ThreadTS
	if thread == "" {
		thread = ev.TS
	}
	server := cb.TeamID
	if server == "" {
		server = ev.Team
	}
	author := ev.User
	if author == "" {
		author = ev.BotID
	}
	text := ev.Text
	if self.UserID != "" {
		text = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(text), mention))
	}
	m := connector.Message{
		Connector: c.id,
		ID:        ev.Channel + ":" + ev.TS,
		Channel:   ev.Channel,
		Server:    server,
		Thread:    thread,
		Author:    author,
		Text:      text,
	}
	if !isBot {
		m.AuthorID = ev.User // who decides approvals; never a bot
	}
	if ev.ChannelType != "" {
		m.Meta = map[string]string{"channel_type": ev.ChannelType}
	}
	for _, f := range ev.Files {
		u := f.URLPrivateDownload
		if u == "" {
			u = f.URLPrivate
		}
		name := f.Name
		if name == "" {
			name = f.Title
		}
		m.Files = append(m.Files, connector.Attachment{Name: name, Type: f.Mimetype, Size: f.Size, URL: u})
	}
	return m, ""
}

// eventFile is a file object of a message event.
type eventFile struct {
	ID                 string `json:"id"`
	Name               string `json:"name"`
	Title              string `json:"title"`
	Mimetype           string `json:"mimetype"`
	Size               int64  `json:"size"`
	URLPrivate         string `json:"url_private"`
	URLPrivateDownload string `json:"url_private_download"`
}

// AttachmentRequest implements connector.AttachmentFetcher: a file's
// url_private is fetched with the bot token (Slack answers its sign-in
// page otherwise), and only from Slack's own hosts (or the host of
// BaseURL), so that a URL in an event never gets the token elsewhere.
func (c *Connector) AttachmentRequest(ctx context.Context, a connector.Attachment) (*http.Request, error) {
	u, err := url.Parse(a.URL)
	if err != nil || u.Scheme != "https" && u.Scheme != "http" {
		return nil, fmt.Errorf("the file link %q is not an http(s) URL", a.URL)
	}
	api, _ := url.Parse(c.o.BaseURL)
	host := strings.ToLower(u.Hostname())
	slackHost := u.Scheme == "https" && (host == "slack.com" || strings.HasSuffix(host, ".slack.com") || strings.HasSuffix(host, ".slack-edge.com"))
	if !slackHost && (api == nil || !strings.EqualFold(u.Host, api.Host)) {
		return nil, fmt.Errorf("the file link's host %q is not Slack's; the bot token is not sent there", u.Host)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.URL, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.o.BotToken)
	return req, nil
}
