package config_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/config"
)

// env is a service environment for getenv.
type env map[string]string

func (e env) get(name string) string { return e[name] }

func writeFile(t *testing.T, path, text string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(text), mode); err != nil {
		t.Fatal(err)
	}
}

func TestConnectorCredentialResolvesReferences(t *testing.T) {
	t.Parallel()
	const secret = "MTA4NzY1NDMyMTA5ODc2NTQzMg.GhIjKl.AbCdEfGhIjKlMnOpQrStUvWxYz012345"
	creds := t.TempDir()
	writeFile(t, filepath.Join(creds, "discord-token"), secret+"\n", 0o600)
	writeFile(t, filepath.Join(creds, "empty"), "\n", 0o600)
	abs := filepath.Join(t.TempDir(), "token")
	writeFile(t, abs, secret, 0o600)

	tests := []struct {
		name    string
		ref     string
		env     env
		want    string
		wantErr string
	}{
		{name: "A $VAR reference reads the service's environment", ref: "$DISCORD_TOKEN", env: env{"DISCORD_TOKEN": secret}, want: secret},
		{name: "A credential name reads CREDENTIALS_DIRECTORY without the trailing newline", ref: "discord-token", env: env{"CREDENTIALS_DIRECTORY": creds}, want: secret},
		{name: "An absolute path is read as is", ref: abs, env: env{}, want: secret},
		{
			name: "An unset variable names connector, key and variable", ref: "$DISCORD_TOKEN", env: env{},
			wantErr: `connector "dc": token: environment variable DISCORD_TOKEN is not set or empty`,
		},
		{
			name: "A credential name without CREDENTIALS_DIRECTORY says how to load it", ref: "discord-token", env: env{},
			wantErr: `connector "dc": token: credential "discord-token" cannot be read: $CREDENTIALS_DIRECTORY is not set (add LoadCredential=discord-token:/path/to/file to the unit with a drop-in)`,
		},
		{
			name: "A credential that was not loaded names its file", ref: "other", env: env{"CREDENTIALS_DIRECTORY": creds},
			wantErr: `connector "dc": token: credential file ` + filepath.Join(creds, "other") + ` does not exist`,
		},
		{
			name: "An empty credential file is an error", ref: "empty", env: env{"CREDENTIALS_DIRECTORY": creds},
			wantErr: `connector "dc": token: credential file ` + filepath.Join(creds, "empty") + ` is empty`,
		},
		{name: "An unset reference is an error", ref: "", env: env{}, wantErr: `connector "dc": token: is not set`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			k := config.Connector{ID: "dc", Type: "discord", Token: tc.ref}
			got, err := k.Credential(config.CredToken, tc.env.get)
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("Credential = %v, want error %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("Credential = %q, %v; want the secret", got, err)
			}
		})
	}
}

func TestConnectorCredentialRefusesAnUnknownKey(t *testing.T) {
	t.Parallel()
	k := config.Connector{ID: "sl", Type: "slack", BotToken: "$B"}
	_, err := k.Credential("password", env{"B": "x"}.get)
	if err == nil || !strings.Contains(err.Error(), `connector "sl": password is not a credential key`) {
		t.Errorf("Credential(password) = %v, want an error naming the connector and the key", err)
	}
}

func TestCheckCredentials(t *testing.T) {
	t.Parallel()
	const botToken = "xoxb-000000000000-0000000000000-SecretSecretSecret"
	creds := t.TempDir()
	writeFile(t, filepath.Join(creds, "slack-app"), "xapp-1-A0-0-secretapp\n", 0o600)
	hookSecret := filepath.Join(t.TempDir(), "hook.secret")
	writeFile(t, hookSecret, "hook-secret\n", 0o600)
	text := `
[[agents]]
id = "coder"

[[connectors]]
id = "sl"
type = "slack"
app_token = "slack-app"
bot_token = "$SLACK_BOT_TOKEN"

[[connectors]]
id = "hook"
type = "webhook"
secret_file = "` + hookSecret + `"
`
	c := load(t, text)
	tests := []struct {
		name string
		env  env
		want []string // lines of the error; none means success
	}{
		{name: "Every credential present passes", env: env{"CREDENTIALS_DIRECTORY": creds, "SLACK_BOT_TOKEN": botToken}},
		{
			name: "A missing variable refuses the config naming connector and key",
			env:  env{"CREDENTIALS_DIRECTORY": creds},
			want: []string{`connector "sl": bot_token: environment variable SLACK_BOT_TOKEN is not set or empty`},
		},
		{
			name: "Every missing credential is reported at once",
			env:  env{},
			want: []string{
				`connector "sl": app_token: credential "slack-app" cannot be read: $CREDENTIALS_DIRECTORY is not set (add LoadCredential=slack-app:/path/to/file to the unit with a drop-in)`,
				`connector "sl": bot_token: environment variable SLACK_BOT_TOKEN is not set or empty`,
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := config.CheckCredentials(c, tc.env.get)
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("CheckCredentials: %v", err)
				}
				return
			}
			if err == nil || err.Error() != strings.Join(tc.want, "\n") {
				t.Fatalf("CheckCredentials = %v, want\n%s", err, strings.Join(tc.want, "\n"))
			}
		})
	}

	t.Run("A webhook whose secret file is gone refuses the config", func(t *testing.T) {
		t.Parallel()
		gone := *c
		gone.Connectors = []config.Connector{{ID: "hook", Type: "webhook", SecretFile: filepath.Join(t.TempDir(), "missing")}}
		err := config.CheckCredentials(&gone, env{}.get)
		if err == nil || !strings.Contains(err.Error(), `connector "hook"`) {
			t.Errorf("CheckCredentials = %v, want an error naming connector hook", err)
		}
	})
}

func TestWriteCheckShowsCredentialReferencesNeverValues(t *testing.T) {
	t.Parallel()
	const token = "MTA4NzY1NDMyMTA5ODc2NTQzMg.GhIjKl.AbCdEfGhIjKlMnOpQrStUvWxYz012345"
	abs := filepath.Join(t.TempDir(), "discord.token")
	writeFile(t, abs, token+"\n", 0o600)
	path := writeConfig(t, map[string]string{"berth.toml": `
[[agents]]
id = "coder"

[retention]
delivered_hours = 96

[[connectors]]
id = "dc"
type = "discord"
token = "` + abs + `"
guild_ids = ["42"]
default_agent = "coder"

[[connectors]]
id = "sl"
type = "slack"
app_token = "$SLACK_APP_TOKEN"
bot_token = "slack-bot"

[[bindings]]
connector = "sl"
server_id = "T0123"
agent = "coder"
`})
	for _, agent := range []string{"", "coder"} {
		t.Run("agent "+agent, func(t *testing.T) {
			t.Parallel()
			var out bytes.Buffer
			if err := config.WriteCheck(&out, path, agent); err != nil {
				t.Fatalf("WriteCheck: %v\n%s", err, out.String())
			}
			want := []string{
				"[connectors.dc]", `token = "` + abs + `"`, `guild_ids = ["42"]`, `base_url = "https://discord.com/api/v10"`,
				"[connectors.sl]", `app_token = "$SLACK_APP_TOKEN"`, `bot_token = "slack-bot"`, `mode = "socket"`,
			}
			if agent == "" {
				want = append(want, "[retention]", "finished_runs_days = 30", "runs_per_agent = 10000", "delivered_hours = 96", "idle_conversation_days = 30")
			} else {
				want = append(want, `routes here: binding server_id "T0123"`)
			}
			for _, w := range want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output does not contain %q:\n%s", w, out.String())
				}
			}
			if strings.Contains(out.String(), "GhIjKl") {
				t.Errorf("output reveals the token:\n%s", out.String())
			}
		})
	}
}
