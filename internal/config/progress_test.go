package config_test

import (
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/config"
)

func TestProgressAndReactions_default_per_platform_and_read_as_written(t *testing.T) {
	t.Parallel()
	path := writeConfig(t, map[string]string{"berth.toml": `
[[agents]]
id = "coder"

[[connectors]]
id = "chat"
type = "meepachat"
base_url = "https://chat.example.org"
token = "meepachat-token"

[[connectors]]
id = "dc"
type = "discord"
token = "$DISCORD_TOKEN"

[[connectors]]
id = "sl"
type = "slack"
app_token = "slack-app-token"
bot_token = "slack-bot-token"

[[connectors]]
id = "dc-edit"
type = "discord"
token = "$DISCORD_TOKEN"
progress = "edit"
reactions = true

[[connectors]]
id = "sl-off"
type = "slack"
app_token = "slack-app-token"
bot_token = "slack-bot-token"
progress = "off"
reactions = true

[[connectors]]
id = "hook"
type = "webhook"
secret = "s"
`})
	c, err := config.Load(path)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	want := map[string]struct {
		progress  string
		reactions bool
	}{
		"chat":    {config.ProgressTyping, false},
		"dc":      {config.ProgressTyping, false},
		"sl":      {config.ProgressOff, false},
		"dc-edit": {config.ProgressEdit, true},
		"sl-off":  {config.ProgressOff, true},
		"hook":    {"", false}, // a webhook has neither
	}
	for _, k := range c.Connectors {
		w := want[k.ID]
		if k.Progress != w.progress || k.Reactions != w.reactions {
			t.Errorf("connector %s: progress %q reactions %v, want %q %v", k.ID, k.Progress, k.Reactions, w.progress, w.reactions)
		}
	}
}

func TestProgress_values_a_platform_cannot_show_are_refused(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, connector, want string
	}{
		{"An_unknown_mode", "id = \"dc\"\ntype = \"discord\"\ntoken = \"$T\"\nprogress = \"stream\"\n",
			`connectors[0].progress: "stream" is not one of edit, typing, off`},
		{"Edit_on_MeepaChat_which_has_no_edit", "id = \"chat\"\ntype = \"meepachat\"\nbase_url = \"https://chat.example.org\"\ntoken = \"$T\"\nprogress = \"edit\"\n",
			`connectors[0].progress: cannot be "edit": MeepaChat's bot API has no message edit; use "typing" or "off"`},
		{"Progress_on_a_webhook", "id = \"hook\"\ntype = \"webhook\"\nsecret = \"s\"\nprogress = \"typing\"\n",
			`connectors[0].progress: is not a key of a webhook connector`},
		{"Reactions_on_a_webhook", "id = \"hook\"\ntype = \"webhook\"\nsecret = \"s\"\nreactions = true\n",
			`connectors[0].reactions: is not a key of a webhook connector`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := writeConfig(t, map[string]string{"berth.toml": "[[agents]]\nid = \"coder\"\n\n[[connectors]]\n" + tc.connector})
			_, err := config.Load(path)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Load error = %v, want one containing %q", err, tc.want)
			}
		})
	}
}
