package slack

import (
	"context"
	"testing"

	"github.com/berth-dev/berth/services/intake/connector"
)

// The bot token goes with a file download to Slack's hosts (and the
// configured API's host) only.
func TestAttachmentRequestSendsTheTokenToSlackOnly(t *testing.T) {
	c := &Connector{o: Options{BaseURL: "http://127.0.0.1:4242/api/", BotToken: "xoxb-secret"}}
	for url, ok := range map[string]bool{
		"https://files.slack.com/files-pri/T1-F1/download/a.txt": true,
		"http://127.0.0.1:4242/files-pri/T1-F1/download/a.txt":   true,
		"http://files.slack.com/files-pri/T1-F1/a.txt":           false, // not https
		"https://files.slack.com.evil.example/a.txt":             false,
		"https://evil.example/a.txt":                             false,
		"http://127.0.0.1:4243/a.txt":                            false, // another port
		"file:///etc/passwd":                                     false,
	} {
		req, err := c.AttachmentRequest(context.Background(), connector.Attachment{Name: "a.txt", URL: url})
		if ok && (err != nil || req.Header.Get("Authorization") != "Bearer xoxb-secret") {
			t.Errorf("%s: %v, %v; want a request with the bot token", url, req, err)
		}
		if !ok && err == nil {
			t.Errorf("%s: a request was made (Authorization %q); want a refusal", url, req.Header.Get("Authorization"))
		}
	}
}
