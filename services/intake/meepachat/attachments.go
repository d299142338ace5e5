package meepachat

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/berth-dev/berth/services/intake/connector"
)

// Inbound attachments (issue 26). A message.created message carries its
// files as attachment objects {id, filename, storedPath, mimeType,
// sizeBytes}; MeepaChat's own bot client (openclaw/src/http-client.ts in
// its repository) downloads one with GET {base_url}/{storedPath} and the
// bot token. Intake downloads them (never the sandbox) through
// AttachmentRequest, which sends the token only to this instance.

// wireAttachment is one file of an inbound message.
type wireAttachment struct {
	ID         string `json:"id"`
	Filename   string `json:"filename"`
	StoredPath string `json:"storedPath"`
	MimeType   string `json:"mimeType"`
	SizeBytes  int64  `json:"sizeBytes"`
}

// attachments are m's files as intake takes them; one whose stored path
// is not a plain path on this instance is left out (and logged).
func (c *Connector) attachments(w wireMessage) []connector.Attachment {
	var out []connector.Attachment
	for _, a := range w.Attachments {
		u, ok := c.storedURL(a.StoredPath)
		if !ok {
			c.log.Warn("meepachat attachment with an unusable storedPath left out", "message_id", w.ID, "attachment_id", a.ID)
			continue
		}
		name := a.Filename
		if name == "" {
			name = a.ID
		}
		out = append(out, connector.Attachment{Name: name, Type: a.MimeType, Size: max(a.SizeBytes, 0), URL: u})
	}
	return out
}

// storedURL is the download URL of a stored path: a plain path under the
// instance's base URL, no scheme, host, query or dot segment of its own.
func (c *Connector) storedURL(stored string) (string, bool) {
	p := strings.TrimLeft(stored, "/")
	if p == "" || strings.ContainsAny(p, "?#\\%") || strings.Contains(p, "://") {
		return "", false
	}
	for _, seg := range strings.Split(p, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return "", false
		}
		for _, r := range seg {
			if r < 0x21 || r == 0x7f {
				return "", false
			}
		}
	}
	return c.base + "/" + p, true
}

// AttachmentRequest implements connector.AttachmentFetcher: the download
// of a, with the bot token, for a URL on this instance only.
func (c *Connector) AttachmentRequest(ctx context.Context, a connector.Attachment) (*http.Request, error) {
	base, err := url.Parse(c.base + "/")
	if err != nil {
		return nil, err
	}
	u, err := url.Parse(a.URL)
	if err != nil || u.Scheme != base.Scheme || u.Host != base.Host || !strings.HasPrefix(u.Path, base.Path) || u.User != nil {
		return nil, fmt.Errorf("attachment %s is not on this MeepaChat instance: the bot token is not sent there", a.Name)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bot "+c.o.Token)
	return req, nil
}
