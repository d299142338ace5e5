package config

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"log/slog"
	"maps"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
)

// ConnectorTypes are the values of [[connectors]] type.
var ConnectorTypes = []string{ConnectorWebhook, ConnectorMeepaChat, ConnectorDiscord, ConnectorSlack}

// connectorKeys are the keys each connector type may set (the types= of
// Connector's tags, in field order); a key of another type is an error, so a
// slack option left on a discord connector is not silently ignored.
var connectorKeys = func() map[string][]string {
	keys := map[string][]string{}
	for _, f := range specsOf(reflect.TypeFor[Connector]()) {
		for _, typ := range ConnectorTypes {
			if len(f.types) == 0 || slices.Contains(f.types, typ) {
				keys[typ] = append(keys[typ], f.key)
			}
		}
	}
	return keys
}()

// snowflakePattern is a Discord id: a decimal 64-bit number.
var snowflakePattern = regexp.MustCompile(`^[0-9]{1,20}$`)

func gatewayURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.Host == "" || !slices.Contains([]string{"ws", "wss", "http", "https"}, u.Scheme) {
		return fmt.Sprintf("%q is not an absolute ws(s) or http(s) URL", s)
	}
	return ""
}

// caFile checks a CA bundle exists and holds at least one PEM certificate.
func caFile(s string) string {
	if msg := absolutePath(s); msg != "" {
		return msg
	}
	data, err := os.ReadFile(s)
	if err != nil {
		if os.IsNotExist(err) {
			return fmt.Sprintf("%s does not exist", s)
		}
		return fmt.Sprintf("cannot read %s: %v", s, err)
	}
	if !x509.NewCertPool().AppendCertsFromPEM(data) {
		return fmt.Sprintf("%s holds no PEM certificate", s)
	}
	return ""
}

func ed25519PublicKey(s string) string {
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != 32 {
		return fmt.Sprintf("%q is not an Ed25519 public key: want 64 hex digits (the application's PUBLIC KEY in the Discord developer portal)", s)
	}
	return ""
}

func snowflake(s string) string {
	if !snowflakePattern.MatchString(s) {
		return fmt.Sprintf("%q is not a Discord id (a decimal number)", s)
	}
	return ""
}

// connectorMerged checks what a connector's type asks of the merged
// connector: only its type's keys, and the keys it needs.
func (c *checks) connectorMerged(e *entry[Connector]) {
	k := &e.v
	if _, ok := e.at["type"]; !ok {
		c.fail(where(e.at, e.self, "type"), "is required: one of %s", strings.Join(ConnectorTypes, ", "))
		return
	}
	allowed, known := connectorKeys[k.Type]
	if !known {
		return // reported by its value check
	}
	for _, name := range slices.Sorted(maps.Keys(e.at)) {
		if !slices.Contains(allowed, name) {
			c.fail(e.at[name], "is not a key of a %s connector (its keys: %s)", k.Type, strings.Join(allowed, ", "))
		}
	}
	need := func(name, why string) {
		if _, ok := e.at[name]; !ok {
			c.fail(where(e.at, e.self, name), "is required%s", why)
		}
	}
	refuse := func(name, why string) {
		if l, ok := e.at[name]; ok {
			c.fail(l, "%s", why)
		}
	}
	switch k.Type {
	case ConnectorWebhook:
		_, hasSecret := e.at["secret"]
		_, hasFile := e.at["secret_file"]
		switch {
		case hasSecret && hasFile:
			s := e.at["secret"]
			c.fail(e.at["secret_file"], "set either secret or secret_file, not both (secret is set at %s:%d)", s.file, s.line)
		case !hasSecret && !hasFile:
			c.fail(where(e.at, e.self, "secret"), "a webhook connector needs secret or secret_file")
		}
	case ConnectorMeepaChat:
		need("base_url", ": MeepaChat is self-hosted, give its address (https://chat.example.org)")
		need("token", `: the bot's "<bot_id>.<secret>", as a reference ("$VAR" or a credential name)`)
		if k.Progress == ProgressEdit {
			refuse("progress", `cannot be "edit": MeepaChat's bot API has no message edit; use "typing" or "off"`)
		}
	case ConnectorDiscord:
		// A bot token holds the Gateway; a public key alone serves slash
		// commands over HTTP. One of them is needed.
		_, hasToken := e.at["token"]
		_, hasKey := e.at["public_key"]
		if !hasToken && !hasKey {
			need("token", ": the bot token, as a reference (\"$VAR\" or a credential name); or public_key alone for slash commands over HTTP only")
		}
	case ConnectorSlack:
		need("bot_token", ": the xoxb- bot token, as a reference (\"$VAR\" or a credential name)")
		if k.Mode == SlackEvents {
			need("signing_secret", ` in mode "events": the app's signing secret verifies each request`)
			refuse("app_token", `is only used in mode "socket"; remove it or set mode = "socket"`)
		} else {
			need("app_token", ` in mode "socket": the xapp- app-level token with connections:write`)
			refuse("signing_secret", `is only used in mode "events"; remove it or set mode = "events"`)
		}
	}
}

// HoldsConnection tells whether the connector keeps a long-lived connection
// to its platform (a gateway WebSocket, Slack's Socket Mode), which keeps
// berth-intake running instead of exiting when idle.
func (c Connector) HoldsConnection() bool {
	switch c.Type {
	case ConnectorMeepaChat:
		return true
	case ConnectorDiscord:
		return c.Token != "" // interactions only: HTTP, no Gateway
	case ConnectorSlack:
		return c.Mode != SlackEvents
	}
	return false
}

// TLSConfig is the TLS client configuration for the connector's platform:
// the system's roots plus ca_file, or no verification when tls_verify is
// false.
func (c Connector) TLSConfig() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if !c.TLSVerify {
		cfg.InsecureSkipVerify = true // the admin asked for it: tls_verify = false
		return cfg, nil
	}
	if c.CAFile == "" {
		return cfg, nil
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	data, err := os.ReadFile(c.CAFile)
	if err != nil {
		return nil, fmt.Errorf("connector %q: cannot read ca_file: %w", c.ID, err)
	}
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("connector %q: ca_file %s holds no PEM certificate", c.ID, c.CAFile)
	}
	cfg.RootCAs = pool
	return cfg, nil
}

// LogValue keeps a webhook's inline secret out of logs when a connector is
// logged whole; credential references are not secrets and are shown.
func (c Connector) LogValue() slog.Value {
	attrs := []slog.Attr{slog.String("id", c.ID), slog.String("type", c.Type)}
	if c.Secret != "" {
		attrs = append(attrs, slog.String("secret", "(set)"))
	}
	for _, key := range c.Credentials() {
		ref, _ := c.CredentialRef(key)
		attrs = append(attrs, slog.String(key, ref))
	}
	if c.BaseURL != "" {
		attrs = append(attrs, slog.String("base_url", c.BaseURL))
	}
	return slog.GroupValue(attrs...)
}
