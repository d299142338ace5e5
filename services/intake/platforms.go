package intake

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/services/intake/connector"
	"github.com/berth-dev/berth/services/intake/discord"
	"github.com/berth-dev/berth/services/intake/meepachat"
	"github.com/berth-dev/berth/services/intake/slack"
)

// The chat platforms every intake knows: each [[connectors]] entry of these
// types is built from its config here, credentials resolved from the
// service's environment or $CREDENTIALS_DIRECTORY (LoadCredential=).
func init() {
	platformFactories[config.ConnectorMeepaChat] = newMeepaChat
	platformFactories[config.ConnectorDiscord] = newDiscord
	platformFactories[config.ConnectorSlack] = newSlack
}

// credential resolves key of c, or "" when c does not set it.
func credential(c config.Connector, key string) (string, error) {
	if ref, err := c.CredentialRef(key); err != nil || ref == "" {
		return "", nil
	}
	v, err := c.Credential(key, os.Getenv)
	if err != nil {
		return "", fmt.Errorf("cannot build connector %s: %w", c.ID, err)
	}
	return v, nil
}

func newMeepaChat(c config.Connector, log *slog.Logger) (connector.Connector, error) {
	token, err := credential(c, config.CredToken)
	if err != nil {
		return nil, err
	}
	return meepachat.New(c.ID, meepachat.Options{
		BaseURL:       c.BaseURL,
		GatewayURL:    c.GatewayURL,
		Token:         token,
		SkipTLSVerify: !c.TLSVerify,
		CAFile:        c.CAFile,
		AllowBots:     c.AllowBots,
		Trigger:       c.Trigger,
		Logger:        log,
	})
}

func newDiscord(c config.Connector, log *slog.Logger) (connector.Connector, error) {
	token, err := credential(c, config.CredToken)
	if err != nil {
		return nil, err
	}
	return discord.New(c.ID, discord.Options{
		BaseURL:            c.BaseURL,
		GatewayURL:         c.GatewayURL,
		BotToken:           token,
		ApplicationID:      c.ApplicationID,
		PublicKey:          c.PublicKey,
		GuildIDs:           c.GuildIDs,
		AllowBots:          c.AllowBots,
		Trigger:            c.Trigger,
		InsecureSkipVerify: !c.TLSVerify,
		CAFile:             c.CAFile,
		Logger:             log,
	})
}

func newSlack(c config.Connector, log *slog.Logger) (connector.Connector, error) {
	var creds [3]string
	for i, key := range []string{config.CredAppToken, config.CredBotToken, config.CredSigningSecret} {
		v, err := credential(c, key)
		if err != nil {
			return nil, err
		}
		creds[i] = v
	}
	return slack.New(c.ID, slack.Options{
		Mode:               c.Mode,
		BaseURL:            c.BaseURL,
		AppToken:           creds[0],
		BotToken:           creds[1],
		SigningSecret:      creds[2],
		AllowBots:          c.AllowBots,
		Trigger:            c.Trigger,
		InsecureSkipVerify: !c.TLSVerify,
		CAFile:             c.CAFile,
		Logger:             log,
	})
}
