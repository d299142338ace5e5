package discord

import (
	"crypto/ed25519"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/backoff"
	"github.com/berth-dev/berth/services/intake/connector"
	"github.com/jonboulle/clockwork"
)

// Platform limits and defaults.
const (
	// MessageLimit is the most characters Discord takes in one message.
	MessageLimit = 2000

	DefaultBaseURL        = "https://discord.com/api/v10"
	apiPath               = "/api/v10"
	defaultBackoffMin     = time.Second
	defaultBackoffMax     = 2 * time.Minute
	defaultMaxInlineWait  = 5 * time.Second
	defaultRequestTimeout = 15 * time.Second
	defaultHandshake      = 30 * time.Second
	defaultAcceptTimeout  = 30 * time.Second
	defaultMaxFrameBytes  = 16 << 20
	// interactionAcceptTimeout keeps the deferred answer inside Discord's
	// three seconds.
	interactionAcceptTimeout = 2500 * time.Millisecond
)

// otherAPIVersion finds a base_url path that ends in an API version.
var otherAPIVersion = regexp.MustCompile(`/api/v[0-9]+$`)

// Trigger values: which guild messages go to an agent (DMs always do).
const (
	TriggerMention = "mention"
	TriggerAll     = "all"
)

// Options configures one Discord connector. Credentials are plain strings,
// already resolved from the environment or $CREDENTIALS_DIRECTORY.
type Options struct {
	// BaseURL is the REST API ("https://discord.com/api/v10"); the host
	// alone ("https://discord.com", a fake's address) gets /api/v10 added,
	// as does any other path (a reverse proxy's prefix); trailing slashes
	// do not count.
	BaseURL string
	// GatewayURL overrides the URL GET /gateway/bot answers (ws:// or wss://).
	GatewayURL string
	// BotToken is the bot's token (without "Bot "). Empty: no Gateway, only
	// the Interactions endpoint (and follow-ups, which need no token).
	BotToken string
	// ApplicationID is the application's id; when set, interactions for
	// another application are refused.
	ApplicationID string
	// PublicKey is the application's Ed25519 public key (hex, as the
	// Developer Portal shows it). Empty: the Interactions endpoint answers 404.
	PublicKey string
	// GuildIDs limits guild messages to these guilds; empty: all guilds.
	GuildIDs []string
	// AllowBots lets messages of other bots through (own messages never).
	AllowBots bool
	// Trigger is TriggerMention (default) or TriggerAll.
	Trigger string

	// InsecureSkipVerify turns TLS verification off (tls_verify = false).
	InsecureSkipVerify bool
	// CAFile is a PEM bundle trusted in addition to the system roots.
	CAFile string
	// HTTPClient, when set, is used for REST and the Gateway as it is
	// (InsecureSkipVerify and CAFile must then be unset).
	HTTPClient *http.Client

	// Logger receives the connector's log; it should carry connector=id
	// (intake's factory logger does), New does not add it again.
	Logger *slog.Logger
	// Clock drives back-off, heartbeats and rate-limit waits.
	Clock clockwork.Clock
	// BackoffMin and BackoffMax bound the reconnect back-off (defaults 1s, 2m).
	BackoffMin, BackoffMax time.Duration
	// MaxInlineWait is the longest rate-limit wait Send sleeps; a longer one
	// returns a *connector.RetryAfterError (default 5s).
	MaxInlineWait time.Duration
	// RequestTimeout bounds each REST call (default 15s).
	RequestTimeout time.Duration
	// HandshakeTimeout bounds a Gateway connection from dial to READY or
	// RESUMED (default 30s).
	HandshakeTimeout time.Duration
	// AcceptTimeout bounds one sink.Accept of a Gateway message (default 30s).
	AcceptTimeout time.Duration
	// MaxFrameBytes is the largest Gateway frame read (default 16 MiB); a
	// larger one drops the connection.
	MaxFrameBytes int64
}

// Connector is one Discord bot (Gateway + REST) and/or application
// (Interactions endpoint).
type Connector struct {
	id        string
	o         Options
	log       *slog.Logger
	clock     clockwork.Clock
	http      *http.Client
	apiBase   string
	publicKey ed25519.PublicKey
	guilds    map[string]bool

	limits *rateLimits

	status *connector.StatusKeeper

	mu            sync.Mutex // guards the fields below; never held across I/O
	contentWarned bool
	channels      map[string]channelInfo
	progress      map[string]int // reply key → chunks already posted
	gateway       string         // cached answer of GET /gateway/bot
}

var (
	_ connector.Connector    = (*Connector)(nil)
	_ connector.HTTPReceiver = (*Connector)(nil)
	_ connector.LongLived    = (*Connector)(nil)
	_ connector.Typer        = (*Connector)(nil)
)

// New validates o and returns the connector for [[connectors]] id.
func New(id string, o Options) (*Connector, error) {
	if err := validate(id, &o); err != nil {
		return nil, fmt.Errorf("discord connector %q: %w", id, err)
	}
	c := &Connector{
		id:       id,
		o:        o,
		log:      o.Logger,
		clock:    o.Clock,
		apiBase:  apiBase(o.BaseURL),
		guilds:   map[string]bool{},
		channels: map[string]channelInfo{},
		progress: map[string]int{},
	}
	for _, g := range o.GuildIDs {
		c.guilds[g] = true
	}
	if o.PublicKey != "" {
		k, _ := hex.DecodeString(o.PublicKey) // validated
		c.publicKey = ed25519.PublicKey(k)
	}
	client, err := httpClient(o)
	if err != nil {
		return nil, fmt.Errorf("discord connector %q: %w", id, err)
	}
	c.http = client
	c.limits = newRateLimits(c.clock)
	state := connector.StateStopped // until Run starts the Gateway
	if o.BotToken == "" {
		state = connector.StateHTTP
	}
	c.status = connector.NewStatusKeeper("discord", state, c.clock.Now)
	return c, nil
}

func validate(id string, o *Options) error {
	if id == "" {
		return errors.New("the connector id is empty")
	}
	if o.BaseURL == "" {
		o.BaseURL = DefaultBaseURL
	}
	u, err := url.Parse(o.BaseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("base_url %q is not an http(s) URL", o.BaseURL)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("base_url %q has a query or fragment; give the host or the API root", o.BaseURL)
	}
	if v := otherAPIVersion.FindString(strings.TrimRight(u.Path, "/")); v != "" && v != apiPath {
		return fmt.Errorf("base_url %q names API %s; berth speaks %s (give the host or the root ending in %s)", o.BaseURL, strings.TrimPrefix(v, "/api/"), strings.TrimPrefix(apiPath, "/api/"), apiPath)
	}
	if o.GatewayURL != "" {
		g, err := url.Parse(o.GatewayURL)
		if err != nil || (g.Scheme != "ws" && g.Scheme != "wss") || g.Host == "" {
			return fmt.Errorf("gateway_url %q is not a ws(s) URL", o.GatewayURL)
		}
	}
	o.BotToken = strings.TrimPrefix(strings.TrimSpace(o.BotToken), "Bot ")
	if strings.ContainsAny(o.BotToken, " \t\r\n") {
		return errors.New("bot_token contains white space")
	}
	if o.PublicKey != "" {
		k, err := hex.DecodeString(strings.TrimSpace(o.PublicKey))
		if err != nil || len(k) != ed25519.PublicKeySize {
			return fmt.Errorf("public_key must be %d hex characters (the application's public key)", 2*ed25519.PublicKeySize)
		}
		o.PublicKey = strings.TrimSpace(o.PublicKey)
	}
	if o.BotToken == "" && o.PublicKey == "" {
		return errors.New("neither bot_token (Gateway) nor public_key (Interactions endpoint) is set")
	}
	for _, g := range o.GuildIDs {
		if g == "" || strings.Trim(g, "0123456789") != "" {
			return fmt.Errorf("guild_ids: %q is not a Discord id", g)
		}
	}
	if o.ApplicationID != "" && strings.Trim(o.ApplicationID, "0123456789") != "" {
		return fmt.Errorf("application_id %q is not a Discord id", o.ApplicationID)
	}
	switch o.Trigger {
	case "":
		o.Trigger = TriggerMention
	case TriggerMention, TriggerAll:
	default:
		return fmt.Errorf("trigger %q: want %q or %q", o.Trigger, TriggerMention, TriggerAll)
	}
	if o.HTTPClient != nil && (o.InsecureSkipVerify || o.CAFile != "") {
		return errors.New("tls_verify and ca_file cannot be combined with a custom HTTP client")
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Clock == nil {
		o.Clock = clockwork.NewRealClock()
	}
	if o.BackoffMin <= 0 {
		o.BackoffMin = defaultBackoffMin
	}
	if o.BackoffMax <= 0 {
		o.BackoffMax = defaultBackoffMax
	}
	if err := (backoff.Policy{Min: o.BackoffMin, Max: o.BackoffMax}).Check(); err != nil {
		return err
	}
	if o.MaxInlineWait <= 0 {
		o.MaxInlineWait = defaultMaxInlineWait
	}
	if o.RequestTimeout <= 0 {
		o.RequestTimeout = defaultRequestTimeout
	}
	if o.HandshakeTimeout <= 0 {
		o.HandshakeTimeout = defaultHandshake
	}
	if o.AcceptTimeout <= 0 {
		o.AcceptTimeout = defaultAcceptTimeout
	}
	if o.MaxFrameBytes <= 0 {
		o.MaxFrameBytes = defaultMaxFrameBytes
	}
	return nil
}

func httpClient(o Options) (*http.Client, error) {
	if o.HTTPClient != nil {
		return o.HTTPClient, nil
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: o.InsecureSkipVerify} //nolint:gosec // tls_verify = false is the admin's choice
	if o.CAFile != "" {
		pem, err := os.ReadFile(o.CAFile)
		if err != nil {
			return nil, fmt.Errorf("cannot read ca_file: %w", err)
		}
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("ca_file %s holds no PEM certificate", o.CAFile)
		}
		tr.TLSClientConfig.RootCAs = pool
	}
	return &http.Client{Transport: tr}, nil
}

// apiBase is the REST API root for a validated base URL: the host alone
// gets /api/v10, a path ending in /api gets /v10, one ending in /api/v10 is
// the root as given, any other path is a prefix (a reverse proxy's) that
// /api/v10 follows. Trailing slashes do not count.
func apiBase(base string) string {
	base = strings.TrimRight(base, "/")
	u, _ := url.Parse(base)
	switch {
	case strings.HasSuffix(u.Path, apiPath):
		return base
	case strings.HasSuffix(u.Path, "/api"):
		return base + strings.TrimPrefix(apiPath, "/api")
	}
	return base + apiPath
}

// LongLived reports whether Run holds a Gateway connection (a bot token is
// configured), so intake does not exit idle.
func (c *Connector) LongLived() bool { return c.o.BotToken != "" }

// Status is the connection's state for `berthctl status`.
func (c *Connector) Status() connector.Status { return c.status.Snapshot() }

// WatchStatus says when Status changes, for intake to publish it at once.
func (c *Connector) WatchStatus() (connector.Status, <-chan struct{}) { return c.status.Watch() }

func (c *Connector) noteEvent() { c.status.Saw(c.clock.Now()) }

// redact removes credentials from text that may quote a request or answer.
func (c *Connector) redact(s string, secrets ...string) string {
	for _, v := range append(secrets, c.o.BotToken) {
		if v != "" {
			s = strings.ReplaceAll(s, v, "[redacted]")
		}
	}
	return s
}
