package meepachat

import (
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

	"github.com/coder/websocket"
	"github.com/jonboulle/clockwork"

	"github.com/berth-dev/berth/internal/backoff"
	"github.com/berth-dev/berth/services/intake/connector"
)

// Type is the [[connectors]] type this package implements.
const Type = "meepachat"

// Protocol constants, as MeepaChat documents them.
const (
	maxSendFrame   = 4096             // bytes the gateway reads per frame
	maxContent     = 4000             // characters per posted message
	pingAfter      = 30 * time.Second // silence before we ping
	deadAfter      = 60 * time.Second // silence that means the connection is dead
	writeTimeout   = 10 * time.Second // the gateway's own write deadline
	dialTimeout    = 30 * time.Second
	readyWithin    = 30 * time.Second // after the upgrade
	defaultRequest = 30 * time.Second
)

// Triggers: which server-channel messages are handed to intake (DMs always).
const (
	TriggerMention = "mention" // messages that mention the bot
	TriggerAll     = "all"     // every message in the bot's channels
)

// Meta keys Send reads back from Reply.Meta.
const (
	MetaServer = "server" // MeepaChat server id of the channel
	MetaDM     = "dm"     // "true" for a DM channel
)

// Options configure one MeepaChat connection. Credentials arrive resolved.
type Options struct {
	// BaseURL is the instance, http(s)://host[:port][/prefix]. Required
	// unless GatewayURL is given (it is then derived from it).
	BaseURL string
	// GatewayURL overrides {BaseURL}/api/bot-gateway (ws, wss, http or
	// https), for admins who copy MeepaGateway's url setting.
	GatewayURL string
	// Token is the bot token "<bot_id>.<secret>". Never logged.
	Token string
	// SkipTLSVerify turns certificate verification off (tls_verify = false).
	SkipTLSVerify bool
	// CAFile is a PEM file of CA certificates trusted besides the system's,
	// for self-hosted instances with a private CA.
	CAFile string
	// HTTPClient, when set, is used for the gateway and REST calls instead of
	// one built from SkipTLSVerify and CAFile (which must then be unset).
	HTTPClient *http.Client
	// AllowBots hands on messages of other bots too (never the bot's own).
	AllowBots bool
	// Trigger is TriggerMention (default: in server channels only messages
	// that mention the bot; DMs always) or TriggerAll (every message in the
	// bot's channels).
	Trigger string
	// Logger receives the connector's log; it should carry connector=id
	// (intake's does). Defaults to slog.Default().
	Logger *slog.Logger
	// Clock drives back-off, heartbeat and Retry-After waits; defaults to the
	// real clock.
	Clock clockwork.Clock
	// BackoffMin and BackoffMax bound the reconnect delay (default 1 s, 60 s).
	BackoffMin, BackoffMax time.Duration
	// MaxRetryWait is the longest Retry-After that Send waits out itself
	// (default 5 s); a longer one is returned as a RetryAfterError.
	MaxRetryWait time.Duration
	// RequestTimeout bounds each REST call (default 30 s).
	RequestTimeout time.Duration
	// MaxFrameBytes is the largest inbound frame accepted (default 1 MiB).
	MaxFrameBytes int64
}

// Connector is one MeepaChat bot connection. It implements
// connector.Connector, connector.LongLived and connector.Typer.
type Connector struct {
	id      string
	o       Options
	base    string // without trailing slash
	gateway string
	client  *http.Client
	log     *slog.Logger
	clock   clockwork.Clock

	status *connector.StatusKeeper

	mu       sync.Mutex
	conn     *websocket.Conn
	bot      botUser
	channels map[string]channelInfo
	progress map[string]sendProgress // reply key → chunks already posted
}

type channelInfo struct {
	server string
	name   string
	dm     bool
}

type sendProgress struct {
	text string
	sent int
}

var (
	_ connector.Connector = (*Connector)(nil)
	_ connector.LongLived = (*Connector)(nil)
	_ connector.Typer     = (*Connector)(nil)
)

// New checks o and returns the connector for [[connectors]] id.
func New(id string, o Options) (*Connector, error) {
	c, err := newConnector(id, o)
	if err != nil {
		return nil, fmt.Errorf("connector %q (meepachat): %w", id, err)
	}
	return c, nil
}

func newConnector(id string, o Options) (*Connector, error) {
	if id == "" {
		return nil, errors.New("the connector needs an id")
	}
	base, gateway, err := endpoints(o.BaseURL, o.GatewayURL)
	if err != nil {
		return nil, err
	}
	botID, secret, ok := strings.Cut(o.Token, ".")
	if !ok || botID == "" || secret == "" || strings.ContainsAny(o.Token, " \t\r\n") {
		return nil, errors.New(`token must be the bot token "<bot_id>.<secret>" that MeepaChat showed when the bot was created`)
	}
	switch o.Trigger {
	case "":
		o.Trigger = TriggerMention
	case TriggerMention, TriggerAll:
	default:
		return nil, fmt.Errorf(`trigger must be "mention" or "all", not %q`, o.Trigger)
	}
	if o.BackoffMin == 0 {
		o.BackoffMin = time.Second
	}
	if o.BackoffMax == 0 {
		o.BackoffMax = 60 * time.Second
	}
	if err := (backoff.Policy{Min: o.BackoffMin, Max: o.BackoffMax}).Check(); err != nil {
		return nil, err
	}
	if o.MaxRetryWait <= 0 {
		o.MaxRetryWait = 5 * time.Second
	}
	if o.RequestTimeout <= 0 {
		o.RequestTimeout = defaultRequest
	}
	if o.MaxFrameBytes <= 0 {
		o.MaxFrameBytes = 1 << 20
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Clock == nil {
		o.Clock = clockwork.NewRealClock()
	}
	client := o.HTTPClient
	if client == nil {
		client, err = newHTTPClient(o.SkipTLSVerify, o.CAFile)
		if err != nil {
			return nil, err
		}
	} else if o.SkipTLSVerify || o.CAFile != "" {
		return nil, errors.New("set either an HTTP client or tls_verify/ca_file, not both")
	}
	return &Connector{
		id: id, o: o, base: base, gateway: gateway, client: client,
		log:      o.Logger,
		clock:    o.Clock,
		status:   connector.NewStatusKeeper(Type, connector.StateConnecting, o.Clock.Now),
		channels: map[string]channelInfo{},
		progress: map[string]sendProgress{},
	}, nil
}

// endpoints returns the REST base and the gateway URL.
func endpoints(baseURL, gatewayURL string) (string, string, error) {
	if baseURL == "" && gatewayURL == "" {
		return "", "", errors.New("base_url is required (the MeepaChat instance, e.g. https://chat.example.com)")
	}
	var base string
	if baseURL != "" {
		u, err := url.Parse(baseURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
			return "", "", fmt.Errorf("base_url must be an http:// or https:// URL of the instance without query or credentials, not %q", redactURL(baseURL))
		}
		base = strings.TrimRight(u.String(), "/")
	}
	gateway := base + "/api/bot-gateway"
	if gatewayURL != "" {
		u, err := url.Parse(gatewayURL)
		if err != nil || u.Host == "" || u.User != nil || u.RawQuery != "" {
			return "", "", fmt.Errorf("gateway_url must be a ws(s):// or http(s):// URL without query or credentials, not %q", redactURL(gatewayURL))
		}
		restScheme := map[string]string{"ws": "http", "wss": "https", "http": "http", "https": "https"}[u.Scheme]
		if restScheme == "" {
			return "", "", fmt.Errorf("gateway_url must be a ws(s):// or http(s):// URL, not %q", redactURL(gatewayURL))
		}
		gateway = u.String()
		if base == "" {
			b := *u
			b.Scheme = restScheme
			b.Path = strings.TrimSuffix(strings.TrimRight(b.Path, "/"), "/api/bot-gateway")
			base = strings.TrimRight(b.String(), "/")
		}
	}
	return base, gateway, nil
}

// redactURL keeps a bad URL out of errors when it may carry a secret.
func redactURL(s string) string {
	if u, err := url.Parse(s); err == nil && (u.User != nil || u.RawQuery != "") {
		return "(a URL with credentials or a query)"
	}
	return s
}

func newHTTPClient(skipVerify bool, caFile string) (*http.Client, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	if skipVerify {
		tr.TLSClientConfig.InsecureSkipVerify = true
	}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("cannot read ca_file: %w", err)
		}
		pool, err := x509.SystemCertPool()
		if err != nil || pool == nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("ca_file %s holds no PEM certificate", caFile)
		}
		tr.TLSClientConfig.RootCAs = pool
	}
	return &http.Client{Transport: tr}, nil
}

// LongLived reports that Run holds the gateway open.
func (c *Connector) LongLived() bool { return true }

// Status is the connection's state for `berthctl status`.
func (c *Connector) Status() connector.Status { return c.status.Snapshot() }

// WatchStatus says when Status changes, for intake to publish it at once.
func (c *Connector) WatchStatus() (connector.Status, <-chan struct{}) { return c.status.Watch() }
