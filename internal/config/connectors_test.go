package config_test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/config"
)

// writeCA writes a self-signed CA certificate as PEM and returns its path.
func writeCA(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

const publicKey = "e2d5d7c1f0a1b2c3d4e5f60718293a4b5c6d7e8f9012345678abcdef01234567"

func TestLoadReadsPlatformConnectorsWithTheirDefaults(t *testing.T) {
	t.Parallel()
	ca := writeCA(t)
	path := writeConfig(t, map[string]string{"berth.toml": `
[[agents]]
id = "coder"

[[connectors]]
id = "chat"
type = "meepachat"
base_url = "https://chat.example.org"
token = "meepachat-token"

[[connectors]]
id = "chat-full"
type = "meepachat"
base_url = "http://127.0.0.1:9000"
gateway_url = "ws://127.0.0.1:9000/api/bot-gateway"
tls_verify = false
ca_file = "` + ca + `"
token = "$MEEPA_TOKEN"
allow_bots = true
trigger = "all"
default_agent = "coder"

[[connectors]]
id = "dc"
type = "discord"
token = "$DISCORD_TOKEN"

[[connectors]]
id = "dc-full"
type = "discord"
base_url = "http://127.0.0.1:9001/api/v10"
gateway_url = "wss://gateway.example"
token = "/etc/berth/discord.token"
public_key = "` + publicKey + `"
application_id = "1234567890123"
guild_ids = ["111", "222"]

[[connectors]]
id = "sl"
type = "slack"
app_token = "slack-app-token"
bot_token = "slack-bot-token"

[[connectors]]
id = "sl-events"
type = "slack"
mode = "events"
base_url = "http://127.0.0.1:9002/api/"
signing_secret = "$SLACK_SIGNING_SECRET"
bot_token = "$SLACK_BOT_TOKEN"
`})
	c, err := config.Load(path)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	want := []config.Connector{
		{ID: "chat", Type: "meepachat", BaseURL: "https://chat.example.org", TLSVerify: true, Token: "meepachat-token", Trigger: "mention", Progress: "typing"},
		{
			ID: "chat-full", Type: "meepachat", BaseURL: "http://127.0.0.1:9000", GatewayURL: "ws://127.0.0.1:9000/api/bot-gateway",
			CAFile: ca, Token: "$MEEPA_TOKEN", AllowBots: true, Trigger: "all", DefaultAgent: "coder", Progress: "typing",
		},
		{ID: "dc", Type: "discord", BaseURL: "https://discord.com/api/v10", TLSVerify: true, Token: "$DISCORD_TOKEN", Trigger: "mention", Progress: "typing"},
		{
			ID: "dc-full", Type: "discord", BaseURL: "http://127.0.0.1:9001/api/v10", GatewayURL: "wss://gateway.example", TLSVerify: true,
			Token: "/etc/berth/discord.token", PublicKey: publicKey, ApplicationID: "1234567890123", GuildIDs: []string{"111", "222"}, Trigger: "mention", Progress: "typing",
		},
		{ID: "sl", Type: "slack", BaseURL: "https://slack.com/api/", TLSVerify: true, AppToken: "slack-app-token", BotToken: "slack-bot-token", Trigger: "mention", Mode: "socket", Progress: "off"},
		{
			ID: "sl-events", Type: "slack", BaseURL: "http://127.0.0.1:9002/api/", TLSVerify: true,
			SigningSecret: "$SLACK_SIGNING_SECRET", BotToken: "$SLACK_BOT_TOKEN", Trigger: "mention", Mode: "events", Progress: "off",
		},
	}
	if !reflect.DeepEqual(c.Connectors, want) {
		t.Errorf("Connectors =\n%+v\nwant\n%+v", c.Connectors, want)
	}
}

func TestLoadMergesAPlatformConnectorAcrossDropIns(t *testing.T) {
	t.Parallel()
	path := writeConfig(t, map[string]string{
		"berth.toml":          "[[connectors]]\nid = \"dc\"\ntype = \"discord\"\ntoken = \"$DISCORD_TOKEN\"\nguild_ids = [\"1\"]\n",
		"berth.d/10-dc.toml":  "[[connectors]]\nid = \"dc\"\ntls_verify = false\ntrigger = \"all\"\n",
		"berth.d/20-dc.toml":  "[[connectors]]\nid = \"dc\"\nguild_ids = []\n",
		"berth.d/30-new.toml": "[[connectors]]\nid = \"sl\"\ntype = \"slack\"\napp_token = \"$A\"\nbot_token = \"$B\"\n",
	})
	c, err := config.Load(path)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	want := []config.Connector{
		{ID: "dc", Type: "discord", BaseURL: "https://discord.com/api/v10", Token: "$DISCORD_TOKEN", GuildIDs: []string{}, Trigger: "all", Progress: "typing"},
		{ID: "sl", Type: "slack", BaseURL: "https://slack.com/api/", TLSVerify: true, AppToken: "$A", BotToken: "$B", Trigger: "mention", Mode: "socket", Progress: "off"},
	}
	if !reflect.DeepEqual(c.Connectors, want) {
		t.Errorf("Connectors =\n%+v\nwant\n%+v", c.Connectors, want)
	}
}

// connBase is a valid configuration the connector error cases add to;
// its first connector starts on line 4.
const connBase = "[[agents]]\nid = \"coder\"\n\n[[connectors]]\n"

func TestLoadRefusesBadConnectorSettingsNamingFileLineAndKey(t *testing.T) {
	t.Parallel()
	notPEM := filepath.Join(t.TempDir(), "not.pem")
	if err := os.WriteFile(notPEM, []byte("hello\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	const how = `write "$VARIABLE" to read it from the service's environment, a credential name (systemd LoadCredential=NAME:/path/to/file, read from $CREDENTIALS_DIRECTORY) or an absolute file path`
	const inClear = "looks like a secret written in clear; it is refused so that it never sits in the config: " + how
	tests := []struct {
		name   string
		files  map[string]string
		want   []string
		secret string // must appear in no error
	}{
		{
			name:  "A slack key on a discord connector is refused",
			files: map[string]string{"berth.toml": connBase + "id = \"dc\"\ntype = \"discord\"\ntoken = \"$T\"\nbot_token = \"$B\"\n"},
			want:  []string{`berth.toml:8: connectors[0].bot_token: is not a key of a discord connector (its keys: id, type, default_agent, base_url, gateway_url, tls_verify, ca_file, token, public_key, application_id, guild_ids, allow_bots, trigger, progress, reactions)`},
		},
		{
			name:  "A webhook key on a slack connector is refused",
			files: map[string]string{"berth.toml": connBase + "id = \"sl\"\ntype = \"slack\"\napp_token = \"$A\"\nbot_token = \"$B\"\nreply_url = \"https://x.example\"\n"},
			want:  []string{`berth.toml:9: connectors[0].reply_url: is not a key of a slack connector (its keys: id, type, default_agent, base_url, tls_verify, ca_file, app_token, bot_token, signing_secret, allow_bots, trigger, mode, progress, reactions)`},
		},
		{
			name:  "A platform key on a webhook connector is refused",
			files: map[string]string{"berth.toml": connBase + "id = \"hook\"\ntype = \"webhook\"\nsecret = \"s\"\ntrigger = \"all\"\n"},
			want:  []string{`berth.toml:8: connectors[0].trigger: is not a key of a webhook connector (its keys: id, type, default_agent, secret, secret_file, reply_url)`},
		},
		{
			name: "A key a drop-in adds that the type set in the main file does not know is refused in the drop-in",
			files: map[string]string{
				"berth.toml":         connBase + "id = \"dc\"\ntype = \"discord\"\ntoken = \"$T\"\n",
				"berth.d/10-dc.toml": "[[connectors]]\nid = \"dc\"\nmode = \"events\"\n",
			},
			want: []string{`berth.d/10-dc.toml:3: connectors[0].mode: is not a key of a discord connector (its keys: id, type, default_agent, base_url, gateway_url, tls_verify, ca_file, token, public_key, application_id, guild_ids, allow_bots, trigger, progress, reactions)`},
		},
		{
			name:  "A MeepaChat connector without base_url is refused because MeepaChat is self-hosted",
			files: map[string]string{"berth.toml": connBase + "id = \"chat\"\ntype = \"meepachat\"\ntoken = \"$T\"\n"},
			want:  []string{`berth.toml:4: connectors[0].base_url: is required: MeepaChat is self-hosted, give its address (https://chat.example.org)`},
		},
		{
			name:  "A discord connector with neither token nor public_key is refused",
			files: map[string]string{"berth.toml": connBase + "id = \"dc\"\ntype = \"discord\"\n"},
			want:  []string{`berth.toml:4: connectors[0].token: is required: the bot token, as a reference ("$VAR" or a credential name); or public_key alone for slash commands over HTTP only`},
		},
		{
			name:  "A slack connector in socket mode needs the app token",
			files: map[string]string{"berth.toml": connBase + "id = \"sl\"\ntype = \"slack\"\nbot_token = \"$B\"\n"},
			want:  []string{`berth.toml:4: connectors[0].app_token: is required in mode "socket": the xapp- app-level token with connections:write`},
		},
		{
			name:  "A slack connector in events mode needs the signing secret and refuses an app token",
			files: map[string]string{"berth.toml": connBase + "id = \"sl\"\ntype = \"slack\"\nmode = \"events\"\napp_token = \"$A\"\nbot_token = \"$B\"\n"},
			want: []string{
				`berth.toml:4: connectors[0].signing_secret: is required in mode "events": the app's signing secret verifies each request`,
				`berth.toml:8: connectors[0].app_token: is only used in mode "socket"; remove it or set mode = "socket"`,
			},
		},
		{
			name:  "A slack connector without a bot token is refused",
			files: map[string]string{"berth.toml": connBase + "id = \"sl\"\ntype = \"slack\"\napp_token = \"$A\"\n"},
			want:  []string{`berth.toml:4: connectors[0].bot_token: is required: the xoxb- bot token, as a reference ("$VAR" or a credential name)`},
		},
		{
			name:   "A slack bot token written in clear is refused without repeating it",
			files:  map[string]string{"berth.toml": connBase + "id = \"sl\"\ntype = \"slack\"\napp_token = \"$A\"\nbot_token = \"xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx\"\n"},
			want:   []string{`berth.toml:8: connectors[0].bot_token: ` + inClear},
			secret: "AbCdEfGhIjKlMnOpQrStUvWx",
		},
		{
			name:   "A slack app token written in clear is refused",
			files:  map[string]string{"berth.toml": connBase + "id = \"sl\"\ntype = \"slack\"\napp_token = \"xapp-1-A0123-456-abc\"\nbot_token = \"$B\"\n"},
			want:   []string{`berth.toml:7: connectors[0].app_token: ` + inClear},
			secret: "xapp-1-A0123",
		},
		{
			name:   "A discord token written in clear is refused",
			files:  map[string]string{"berth.toml": connBase + "id = \"dc\"\ntype = \"discord\"\ntoken = \"MTA4NzY1NDMyMTA5ODc2NTQzMg.GhIjKl.AbCdEfGhIjKlMnOpQrStUvWxYz012345\"\n"},
			want:   []string{`berth.toml:7: connectors[0].token: ` + inClear},
			secret: "GhIjKl",
		},
		{
			name:   "A MeepaChat bot id and secret written in clear are refused",
			files:  map[string]string{"berth.toml": connBase + "id = \"chat\"\ntype = \"meepachat\"\nbase_url = \"https://chat.example.org\"\ntoken = \"01HZX3K4M5N6.9f8e7d6c5b4a39281706f5e4d3c2b1a0\"\n"},
			want:   []string{`berth.toml:8: connectors[0].token: ` + inClear},
			secret: "9f8e7d6c5b4a",
		},
		{
			name:   "A hex signing secret written in clear is refused",
			files:  map[string]string{"berth.toml": connBase + "id = \"sl\"\ntype = \"slack\"\nmode = \"events\"\nsigning_secret = \"8f742231b10e8888abcd99yyyzzz85a5\"\nbot_token = \"$B\"\n"},
			want:   []string{`berth.toml:8: connectors[0].signing_secret: ` + inClear},
			secret: "8f742231b10e",
		},
		{
			name:  "A reference with a bad variable name is refused",
			files: map[string]string{"berth.toml": connBase + "id = \"dc\"\ntype = \"discord\"\ntoken = \"$DISCORD-TOKEN\"\n"},
			want:  []string{`berth.toml:7: connectors[0].token: is not a valid reference: after $ comes an environment variable name (letters, digits, _)`},
		},
		{
			name:  "An empty credential reference is refused",
			files: map[string]string{"berth.toml": connBase + "id = \"dc\"\ntype = \"discord\"\ntoken = \"\"\n"},
			want:  []string{`berth.toml:7: connectors[0].token: must not be empty: ` + how},
		},
		{
			name:  "A relative path is not a credential name",
			files: map[string]string{"berth.toml": connBase + "id = \"dc\"\ntype = \"discord\"\ntoken = \"secrets/discord\"\n"},
			want:  []string{`berth.toml:7: connectors[0].token: is not a credential reference: ` + how},
		},
		{
			name:  "A public key that is not 32 bytes of hex is refused",
			files: map[string]string{"berth.toml": connBase + "id = \"dc\"\ntype = \"discord\"\ntoken = \"$T\"\npublic_key = \"abcd\"\n"},
			want:  []string{`berth.toml:8: connectors[0].public_key: "abcd" is not an Ed25519 public key: want 64 hex digits (the application's PUBLIC KEY in the Discord developer portal)`},
		},
		{
			name:  "A guild id that is not a number is reported on its own element",
			files: map[string]string{"berth.toml": connBase + "id = \"dc\"\ntype = \"discord\"\ntoken = \"$T\"\nguild_ids = [\n  \"123\",\n  \"my-guild\",\n]\n"},
			want:  []string{`berth.toml:10: connectors[0].guild_ids[1]: "my-guild" is not a Discord id (a decimal number)`},
		},
		{
			name:  "An application id that is not a number is refused",
			files: map[string]string{"berth.toml": connBase + "id = \"dc\"\ntype = \"discord\"\ntoken = \"$T\"\napplication_id = \"app\"\n"},
			want:  []string{`berth.toml:8: connectors[0].application_id: "app" is not a Discord id (a decimal number)`},
		},
		{
			name:  "A CA file that does not exist is refused",
			files: map[string]string{"berth.toml": connBase + "id = \"dc\"\ntype = \"discord\"\ntoken = \"$T\"\nca_file = \"/nonexistent/ca.pem\"\n"},
			want:  []string{`berth.toml:8: connectors[0].ca_file: /nonexistent/ca.pem does not exist`},
		},
		{
			name:  "A CA file without a certificate is refused",
			files: map[string]string{"berth.toml": connBase + "id = \"dc\"\ntype = \"discord\"\ntoken = \"$T\"\nca_file = \"" + notPEM + "\"\n"},
			want:  []string{`berth.toml:8: connectors[0].ca_file: ` + notPEM + ` holds no PEM certificate`},
		},
		{
			name:  "A base URL that is not http(s) is refused",
			files: map[string]string{"berth.toml": connBase + "id = \"chat\"\ntype = \"meepachat\"\nbase_url = \"chat.example.org\"\ntoken = \"$T\"\n"},
			want:  []string{`berth.toml:7: connectors[0].base_url: "chat.example.org" is not an absolute http(s) URL`},
		},
		{
			name:  "A gateway URL that is not ws(s) or http(s) is refused",
			files: map[string]string{"berth.toml": connBase + "id = \"dc\"\ntype = \"discord\"\ntoken = \"$T\"\ngateway_url = \"ftp://gw.example\"\n"},
			want:  []string{`berth.toml:8: connectors[0].gateway_url: "ftp://gw.example" is not an absolute ws(s) or http(s) URL`},
		},
		{
			name:  "A trigger other than mention or all is refused",
			files: map[string]string{"berth.toml": connBase + "id = \"dc\"\ntype = \"discord\"\ntoken = \"$T\"\ntrigger = \"always\"\n"},
			want:  []string{`berth.toml:8: connectors[0].trigger: "always" is not one of mention, all`},
		},
		{
			name:  "A slack mode other than socket or events is refused",
			files: map[string]string{"berth.toml": connBase + "id = \"sl\"\ntype = \"slack\"\napp_token = \"$A\"\nbot_token = \"$B\"\nmode = \"rtm\"\n"},
			want:  []string{`berth.toml:9: connectors[0].mode: "rtm" is not one of socket, events`},
		},
		{
			name:  "A string where a boolean belongs is a wrong type",
			files: map[string]string{"berth.toml": connBase + "id = \"dc\"\ntype = \"discord\"\ntoken = \"$T\"\ntls_verify = \"no\"\n"},
			want:  []string{`berth.toml:8: connectors[0].tls_verify: must be a boolean (true or false), not a string`},
		},
		{
			name:  "A misspelt connector key is unknown",
			files: map[string]string{"berth.toml": connBase + "id = \"dc\"\ntype = \"discord\"\ntoken = \"$T\"\nguilds = []\n"},
			want:  []string{`berth.toml:8: connectors[0].guilds: unknown key (known keys: allow_bots, app_token, application_id, base_url, bot_token, ca_file, default_agent, gateway_url, guild_ids, id, mode, progress, public_key, reactions, reply_url, secret, secret_file, signing_secret, tls_verify, token, trigger, type)`},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := writeConfig(t, tc.files)
			_, err := config.Load(path)
			if err == nil {
				t.Fatalf("Load succeeded, want errors %q", tc.want)
			}
			got := errorLines(t, err, path)
			for i := range got {
				got[i] = replaceDir(got[i], path)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Load errors:\n%s\nwant:\n%s", join(got), join(tc.want))
			}
			if tc.secret != "" && strings.Contains(err.Error(), tc.secret) {
				t.Errorf("error reveals the secret %q:\n%v", tc.secret, err)
			}
		})
	}
}

func TestLoadAcceptsCredentialNamesThatAreWords(t *testing.T) {
	t.Parallel()
	for _, ref := range []string{"discord-token", "berth.discord.token", "discord_bot_token_2", "bot@discord", "$DISCORD_BOT_TOKEN", "/etc/credstore/discord.token"} {
		t.Run(ref, func(t *testing.T) {
			t.Parallel()
			path := writeConfig(t, map[string]string{"berth.toml": connBase + "id = \"dc\"\ntype = \"discord\"\ntoken = \"" + ref + "\"\n"})
			if _, err := config.Load(path); err != nil {
				t.Errorf("Load with token = %q: %v, want it accepted as a reference", ref, err)
			}
		})
	}
}

func TestConnectorTLSConfigTrustsTheCAFileOrSkipsVerificationWhenTold(t *testing.T) {
	t.Parallel()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	t.Cleanup(srv.Close)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		k       config.Connector
		wantErr string
	}{
		{name: "A platform signed by the CA file is trusted", k: config.Connector{ID: "chat", TLSVerify: true, CAFile: ca}},
		{name: "Without the CA file a self-signed platform is refused", k: config.Connector{ID: "chat", TLSVerify: true}, wantErr: "certificate"},
		{name: "With tls_verify false the certificate is not checked", k: config.Connector{ID: "chat", TLSVerify: false}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tlsConfig, err := tc.k.TLSConfig()
			if err != nil {
				t.Fatal(err)
			}
			client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsConfig}}
			resp, err := client.Get(srv.URL)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("GET = %v, want an error about the %s", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("GET: %v", err)
			}
			resp.Body.Close()
		})
	}
}

func TestConnectorHoldsConnectionForGatewaysAndSocketMode(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		k    config.Connector
		want bool
	}{
		{"A webhook connector holds no connection", config.Connector{Type: "webhook"}, false},
		{"A MeepaChat connector holds its bot gateway", config.Connector{Type: "meepachat"}, true},
		{"A Discord connector with a bot token holds its gateway", config.Connector{Type: "discord", Token: "$T"}, true},
		{"A Discord connector for slash commands only holds no connection", config.Connector{Type: "discord", PublicKey: "ab"}, false},
		{"A Slack connector in socket mode holds its socket", config.Connector{Type: "slack", Mode: "socket"}, true},
		{"A Slack connector in events mode holds no connection", config.Connector{Type: "slack", Mode: "events"}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := tc.k.HoldsConnection(); got != tc.want {
				t.Errorf("HoldsConnection = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestALoggedConnectorShowsReferencesButNotTheWebhookSecret(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&out, nil))
	log.Info("connector", "connector", config.Connector{ID: "hook", Type: "webhook", Secret: "hunter2-webhook"})
	log.Info("connector", "connector", config.Connector{ID: "sl", Type: "slack", BotToken: "$SLACK_BOT_TOKEN"})
	if strings.Contains(out.String(), "hunter2-webhook") {
		t.Errorf("log reveals the webhook secret:\n%s", out.String())
	}
	for _, w := range []string{`"secret":"(set)"`, `"bot_token":"$SLACK_BOT_TOKEN"`} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("log does not contain %s:\n%s", w, out.String())
		}
	}
}

func TestLoadAcceptsADiscordConnectorForSlashCommandsOnly(t *testing.T) {
	t.Parallel()
	path := writeConfig(t, map[string]string{"berth.toml": connBase + "id = \"dc\"\ntype = \"discord\"\npublic_key = \"" + publicKey + "\"\napplication_id = \"1234567890123\"\n"})
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatalf("Load of an interactions-only discord connector: %v", err)
	}
	if k := cfg.Connectors[0]; k.HoldsConnection() {
		t.Errorf("an interactions-only discord connector holds a connection; intake could never idle out")
	}
}
