package slack

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	slackapi "github.com/slack-go/slack"

	"github.com/berth-dev/berth/internal/backoff"
	"github.com/berth-dev/berth/services/intake/connector"
)

// Modes of the inbound transport.
const (
	ModeSocket = "socket" // Socket Mode: AppToken + BotToken
	ModeEvents = "events" // Events API over HTTP: SigningSecret + BotToken
)

// Triggers: which messages are handed to intake.
const (
	TriggerMention = "mention" // app_mention events and direct messages
	TriggerAll     = "all"     // every message the bot can see
)

// DefaultBaseURL is Slack's Web API.
const DefaultBaseURL = "https://slack.com/api/"

// MessageLimit is the length (characters) a reply is split at: Slack
// truncates text over 40,000 characters and advises at most 4,000.
const MessageLimit = 4000

// Options configure one Slack connector. Credentials are the resolved
// secrets; they never appear in logs, errors or Status.
type Options struct {
	// Mode is ModeSocket (default) or ModeEvents.
	Mode string
	// BaseURL is the Web API root, DefaultBaseURL when empty (tests: a
	// fake). A host alone ("https://slack.example") means its /api/; any
	// other path is the API root as given ("…/api", a proxy's prefix).
	BaseURL string
	// AppToken (xapp-, connections:write) opens Socket Mode connections;
	// required in socket mode.
	AppToken string
	// BotToken (xoxb-) posts replies and identifies the bot (auth.test).
	BotToken string
	// SigningSecret verifies Events API requests; required in events mode.
	SigningSecret string
	// AllowBots hands other bots' messages to intake too (never the bot's own).
	AllowBots bool
	// Trigger is TriggerMention (default) or TriggerAll.
	Trigger string
	// InsecureSkipVerify turns TLS verification off (tls_verify = false).
	InsecureSkipVerify bool
	// CAFile is a PEM bundle trusted in addition to the system's roots.
	CAFile string
	// TLSConfig, when set, is used as is instead of InsecureSkipVerify and
	// CAFile (config.Connector.TLSConfig gives it).
	TLSConfig *tls.Config
	// HTTPClient, when set, is used for the Web API as is (TLS options are
	// then its own); its transport's TLS config is also used for the
	// WebSocket when it is an *http.Transport.
	HTTPClient *http.Client
	// Logger receives the connector's log; it should carry connector=id
	// (intake's does). Defaults to slog.Default().
	Logger *slog.Logger
	// Clock drives back-off, rate-limit waits and the signature window;
	// defaults to the real clock.
	Clock clockwork.Clock
	// BackoffMin and BackoffMax bound the reconnect back-off (defaults 1 s
	// and 2 min).
	BackoffMin, BackoffMax time.Duration
	// MaxInlineWait is the longest 429 Retry-After that Send sleeps itself;
	// a longer one returns a *connector.RetryAfterError (default 5 s).
	MaxInlineWait time.Duration
	// RequestTimeout bounds every Web API call and the WebSocket handshake
	// (default 15 s).
	RequestTimeout time.Duration
	// PingInterval is how long the socket may go without Slack's WebSocket
	// ping before it counts as dead (default 30 s).
	PingInterval time.Duration
	// MaxFrameBytes is the largest WebSocket frame read (default 1 MiB);
	// a larger one drops the connection.
	MaxFrameBytes int64
	// MaxBodyBytes is the largest Events API request body (default 1 MiB).
	MaxBodyBytes int64
}

// Connector is one Slack app connection; it implements connector.Connector,
// connector.HTTPReceiver and connector.LongLived.
type Connector struct {
	id      string
	o       Options
	log     *slog.Logger
	clock   clockwork.Clock
	api     *slackapi.Client
	tlsConf *tls.Config
	secrets []string

	status *connector.StatusKeeper

	mu       sync.Mutex
	self     identity
	names    map[string]string // channel id → name; "" when it cannot be known
	progress map[string]sendProgress
	// badSignatures counts rejected Events API requests in a row (under mu).
	badSignatures int
	// groups are the workspace's user groups by member (interactive.go).
	groups userGroupCache
}

var (
	_ connector.Connector    = (*Connector)(nil)
	_ connector.HTTPReceiver = (*Connector)(nil)
	_ connector.LongLived    = (*Connector)(nil)
)

// identity is who the bot is, from auth.test.
type identity struct {
	UserID, BotID, TeamID string
}

// New checks o and returns the connector with id (the [[connectors]] id).
func New(id string, o Options) (*Connector, error) {
	if id == "" {
		return nil, errors.New("slack connector needs an id")
	}
	if err := o.validate(); err != nil {
		return nil, fmt.Errorf("slack connector %q: %w", id, err)
	}
	tlsConf, err := tlsConfig(o)
	if err != nil {
		return nil, fmt.Errorf("slack connector %q: %w", id, err)
	}
	hc := o.HTTPClient
	if hc == nil {
		hc = &http.Client{Transport: &http.Transport{
			Proxy:               http.ProxyFromEnvironment,
			TLSClientConfig:     tlsConf,
			TLSHandshakeTimeout: o.RequestTimeout,
			IdleConnTimeout:     90 * time.Second,
		}, Timeout: o.RequestTimeout}
	} else if tr, ok := hc.Transport.(*http.Transport); ok && tr.TLSClientConfig != nil {
		tlsConf = tr.TLSClientConfig
	}
	c := &Connector{
		id:       id,
		o:        o,
		log:      o.Logger,
		clock:    o.Clock,
		tlsConf:  tlsConf,
		names:    make(map[string]string),
		progress: make(map[string]sendProgress),
	}
	for _, s := range []string{o.AppToken, o.BotToken, o.SigningSecret} {
		if s != "" {
			c.secrets = append(c.secrets, s)
		}
	}
	c.api = slackapi.New(o.BotToken,
		slackapi.OptionAPIURL(o.BaseURL),
		slackapi.OptionAppLevelToken(o.AppToken),
		slackapi.OptionHTTPClient(hc),
		slackapi.OptionLog(libraryLog{c}),
	)
	state := connector.StateConnecting
	if o.Mode == ModeEvents {
		state = connector.StateHTTP
	}
	c.status = connector.NewStatusKeeper("slack", state, c.clock.Now)
	return c, nil
}

func (o *Options) validate() error {
	switch o.Mode {
	case "":
		o.Mode = ModeSocket
	case ModeSocket, ModeEvents:
	default:
		return fmt.Errorf("mode %q is not %q or %q", o.Mode, ModeSocket, ModeEvents)
	}
	switch o.Trigger {
	case "":
		o.Trigger = TriggerMention
	case TriggerMention, TriggerAll:
	default:
		return fmt.Errorf("trigger %q is not %q or %q", o.Trigger, TriggerMention, TriggerAll)
	}
	if o.BotToken == "" {
		return errors.New("bot_token is missing")
	}
	if !strings.HasPrefix(o.BotToken, "xoxb-") {
		return errors.New("bot_token is not a bot token (it must start with xoxb-)")
	}
	switch o.Mode {
	case ModeSocket:
		if o.AppToken == "" {
			return errors.New("app_token is missing (socket mode needs an app-level token)")
		}
		if !strings.HasPrefix(o.AppToken, "xapp-") {
			return errors.New("app_token is not an app-level token (it must start with xapp-)")
		}
	case ModeEvents:
		if o.SigningSecret == "" {
			return errors.New("signing_secret is missing (events mode verifies every request with it)")
		}
	}
	if o.BaseURL == "" {
		o.BaseURL = DefaultBaseURL
	}
	u, err := url.Parse(o.BaseURL)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return errors.New("base_url is not an http(s) URL of the Web API without credentials or query")
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = "/api"
	}
	u.Path = strings.TrimSuffix(u.Path, "/") + "/"
	o.BaseURL = u.String()
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Clock == nil {
		o.Clock = clockwork.NewRealClock()
	}
	if o.BackoffMin <= 0 {
		o.BackoffMin = time.Second
	}
	if o.BackoffMax <= 0 {
		o.BackoffMax = 2 * time.Minute
	}
	if err := (backoff.Policy{Min: o.BackoffMin, Max: o.BackoffMax}).Check(); err != nil {
		return err
	}
	if o.MaxInlineWait < 0 {
		return errors.New("max inline wait is negative")
	}
	if o.MaxInlineWait == 0 {
		o.MaxInlineWait = 5 * time.Second
	}
	if o.RequestTimeout <= 0 {
		o.RequestTimeout = 15 * time.Second
	}
	if o.PingInterval <= 0 {
		o.PingInterval = 30 * time.Second
	}
	if o.MaxFrameBytes <= 0 {
		o.MaxFrameBytes = 1 << 20
	}
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = 1 << 20
	}
	return nil
}

func tlsConfig(o Options) (*tls.Config, error) {
	if o.TLSConfig != nil {
		return o.TLSConfig.Clone(), nil
	}
	conf := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: o.InsecureSkipVerify} //nolint:gosec // tls_verify = false is the admin's explicit choice
	if o.CAFile == "" {
		return conf, nil
	}
	pem, err := os.ReadFile(o.CAFile)
	if err != nil {
		return nil, fmt.Errorf("cannot read ca_file: %w", err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("ca_file %s holds no PEM certificate", o.CAFile)
	}
	conf.RootCAs = pool
	return conf, nil
}

// LongLived reports whether Run holds a connection open: in socket mode.
func (c *Connector) LongLived() bool { return c.o.Mode == ModeSocket }

// Status is the connection's state for `berthctl status`.
func (c *Connector) Status() connector.Status { return c.status.Snapshot() }

// WatchStatus says when Status changes, for intake to publish it at once.
func (c *Connector) WatchStatus() (connector.Status, <-chan struct{}) { return c.status.Watch() }

func (c *Connector) sawEvent() { c.status.Saw(c.clock.Now()) }

// redact removes the connector's credentials from s; every error text that
// reaches a log line or Status goes through it.
func (c *Connector) redact(s string) string {
	for _, secret := range c.secrets {
		s = strings.ReplaceAll(s, secret, "[redacted]")
	}
	return s
}

func (c *Connector) errText(err error) string {
	if err == nil {
		return ""
	}
	return c.redact(err.Error())
}

// identity returns the bot's identity, asking auth.test once.
func (c *Connector) identity(ctx context.Context) (identity, error) {
	c.mu.Lock()
	self := c.self
	c.mu.Unlock()
	if self.UserID != "" {
		return self, nil
	}
	ctx, cancel := context.WithTimeout(ctx, c.o.RequestTimeout)
	defer cancel()
	resp, err := c.api.AuthTestContext(ctx)
	if err != nil {
		var se slackapi.SlackErrorResponse
		if errors.As(err, &se) && authRefused(se.Err) {
			c.status.Warn(fmt.Sprintf("Slack refused bot_token (%s): check the bot token of the app", se.Err))
		}
		return identity{}, fmt.Errorf("cannot identify the bot with auth.test: %s", c.errText(err))
	}
	self = identity{UserID: resp.UserID, BotID: resp.BotID, TeamID: resp.TeamID}
	c.mu.Lock()
	c.self = self
	c.mu.Unlock()
	c.status.ClearWarning("Slack refused bot_token")
	return self, nil
}

// channelName returns the channel's name (for channel_name bindings) with
// conversations.info, cached. Without the channels:read / groups:read
// scopes it is empty, and routing falls back to channel id, team and the
// default agent.
func (c *Connector) channelName(ctx context.Context, channel string) string {
	c.mu.Lock()
	name, known := c.names[channel]
	c.mu.Unlock()
	if known {
		return name
	}
	// Slack wants an event acknowledged within 3 s: the lookup may not
	// take all of it.
	ctx, cancel := context.WithTimeout(ctx, min(c.o.RequestTimeout, 2*time.Second))
	defer cancel()
	info, err := c.api.GetConversationInfoContext(ctx, &slackapi.GetConversationInfoInput{ChannelID: channel})
	if err != nil {
		var se slackapi.SlackErrorResponse
		if !errors.As(err, &se) {
			c.log.Warn("cannot look up the Slack channel name; routing by id", "channel", channel, "error", c.errText(err))
			return ""
		}
		c.log.Warn("Slack did not tell the channel name; channel_name bindings will not match it",
			"channel", channel, "error", se.Err, "hint", "add the channels:read and groups:read bot scopes")
	} else {
		name = info.Name
	}
	c.mu.Lock()
	c.names[channel] = name
	c.mu.Unlock()
	return name
}

func authRefused(code string) bool {
	switch code {
	case "invalid_auth", "not_authed", "account_inactive", "token_revoked", "token_expired", "not_allowed_token_type", "missing_scope":
		return true
	}
	return false
}

// backoff returns the wait before reconnect attempt n (1 or more): BackoffMin
// doubling up to BackoffMax, less a random cut of up to a quarter.
func (c *Connector) backoff(n int) time.Duration {
	return backoff.Policy{Min: c.o.BackoffMin, Max: c.o.BackoffMax, Jitter: 0.25}.Delay(n)
}

// libraryLog sends slack-go's own log lines (debug only) to slog.
type libraryLog struct{ c *Connector }

func (l libraryLog) Output(_ int, s string) error {
	l.c.log.Debug(l.c.redact(strings.TrimSpace(s)), "source", "slack-go")
	return nil
}
