package discord_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/services/intake/connector"
	"github.com/berth-dev/berth/services/intake/discord"
)

func TestNewRefusesBadOptionsWithAClearError(t *testing.T) {
	t.Parallel()
	key := strings.Repeat("ab", 32)
	notPEM := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		id   string
		o    discord.Options
		want string
	}{
		{"Empty_id", "", discord.Options{BotToken: "t"}, "id is empty"},
		{"No_credential_at_all", "d", discord.Options{}, "neither bot_token"},
		{"Base_URL_not_http", "d", discord.Options{BotToken: "t", BaseURL: "ftp://x"}, "base_url"},
		{"Gateway_URL_not_ws", "d", discord.Options{BotToken: "t", GatewayURL: "http://x"}, "gateway_url"},
		{"Public_key_not_hex", "d", discord.Options{PublicKey: "xyz"}, "public_key"},
		{"Public_key_too_short", "d", discord.Options{PublicKey: "abcd"}, "public_key"},
		{"Guild_id_not_a_snowflake", "d", discord.Options{BotToken: "t", GuildIDs: []string{"general"}}, "guild_ids"},
		{"Application_id_not_a_snowflake", "d", discord.Options{PublicKey: key, ApplicationID: "app"}, "application_id"},
		{"Unknown_trigger", "d", discord.Options{BotToken: "t", Trigger: "always"}, "trigger"},
		{"Token_with_white_space", "d", discord.Options{BotToken: "two words"}, "white space"},
		{"Back_off_max_below_min", "d", discord.Options{BotToken: "t", BackoffMin: time.Minute, BackoffMax: time.Second}, "back-off"},
		{"CA_file_missing", "d", discord.Options{BotToken: "t", CAFile: "/nonexistent/ca.pem"}, "ca_file"},
		{"CA_file_without_PEM", "d", discord.Options{BotToken: "t", CAFile: notPEM}, "no PEM"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := discord.New(tt.id, tt.o)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("New = %v, want an error mentioning %q", err, tt.want)
			}
			if tt.o.BotToken == "two words" && strings.Contains(err.Error(), "two words") {
				t.Errorf("the error quotes the token: %v", err)
			}
		})
	}
}

func TestAnInteractionsOnlyConnectorHoldsNoConnection(t *testing.T) {
	t.Parallel()
	c, err := discord.New("d", discord.Options{PublicKey: strings.Repeat("ab", 32)})
	if err != nil {
		t.Fatal(err)
	}
	if c.LongLived() {
		t.Error("an interactions-only connector keeps intake up")
	}
	if st := c.Status(); st.State != connector.StateHTTP {
		t.Errorf("State = %q, want %q", st.State, connector.StateHTTP)
	}
	if err := c.Run(t.Context(), newSink()); err != nil {
		t.Errorf("Run = %v, want nil at once", err)
	}
}
