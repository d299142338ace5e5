package discord

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"net/url"
	"strings"

	"github.com/berth-dev/berth/services/intake/connector"
)

// Discord's limits on uploads (reference.mdx, Uploading Files; resources/
// message.mdx, Create Message): at most 10 files a message, and 10 MiB of
// files in one request for a bot in a server without boosts. A file over
// 10 MiB is left out with a note; the others go in as few messages as fit.
const (
	maxFilesPerMessage = 10
	maxRequestFiles    = 10 << 20
	maxDescription     = 1024 // an attachment's description (alt text)
)

var fileLimits = connector.FileLimits{Platform: "Discord", MaxFileBytes: maxRequestFiles}

// fileBatches groups files, in order, into messages within Discord's limits.
func fileBatches(files []connector.File) [][]connector.File {
	var out [][]connector.File
	var cur []connector.File
	var size int64
	for _, f := range files {
		if len(cur) == maxFilesPerMessage || (len(cur) > 0 && size+f.Size > maxRequestFiles) {
			out, cur, size = append(out, cur), nil, 0
		}
		cur = append(cur, f)
		size += f.Size
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

// postFiles posts one message with files as a multipart form: payload_json
// (content, attachments [{id, filename, description}], nonce) and a
// files[n] part for attachment n. For a slash command it is a follow-up of
// the interaction.
func (c *Connector) postFiles(ctx context.Context, channel, app, token, interactionID string, files []connector.File, nonce string) error {
	attachments := make([]map[string]any, len(files))
	for i, f := range files {
		a := map[string]any{"id": i, "filename": f.Name}
		if f.Caption != "" {
			a["description"] = cutRunes(f.Caption, maxDescription)
		}
		attachments[i] = a
	}
	payload := map[string]any{"content": cutRunes(connector.FileCaptions(files), MessageLimit), "allowed_mentions": noMentions, "attachments": attachments}
	if token == "" && nonce != "" {
		payload["nonce"], payload["enforce_nonce"] = nonce, true
	}
	body, contentType, err := multipartMessage(payload, files)
	if err != nil {
		return err
	}
	if token != "" {
		if app == "" {
			app = c.o.ApplicationID
		}
		if app == "" {
			return &connector.PermanentError{Reason: "the interaction reply has no application id"}
		}
		route := "POST /webhooks/" + app + "/(interaction " + interactionID + ")"
		_, err = c.callBody(ctx, http.MethodPost, route, "/webhooks/"+url.PathEscape(app)+"/"+url.PathEscape(token), body, contentType, false, token)
		return err
	}
	route := "POST /channels/" + channel + "/messages"
	_, err = c.callBody(ctx, http.MethodPost, route, "/channels/"+url.PathEscape(channel)+"/messages", body, contentType, true)
	return err
}

// multipartMessage is a create-message request with files.
func multipartMessage(payload map[string]any, files []connector.File) ([]byte, string, error) {
	var buf bytes.Buffer
	w := multipart.NewWriter(&buf)
	js, err := json.Marshal(payload)
	if err != nil {
		return nil, "", fmt.Errorf("cannot encode the message: %w", err)
	}
	h := textproto.MIMEHeader{}
	h.Set("Content-Disposition", `form-data; name="payload_json"`)
	h.Set("Content-Type", "application/json")
	part, err := w.CreatePart(h)
	if err == nil {
		_, err = part.Write(js)
	}
	if err != nil {
		return nil, "", fmt.Errorf("cannot encode the message: %w", err)
	}
	for i, f := range files {
		h := textproto.MIMEHeader{}
		h.Set("Content-Disposition", multipart.FileContentDisposition(fmt.Sprintf("files[%d]", i), f.Name))
		h.Set("Content-Type", cmpOr(f.Type, "application/octet-stream"))
		part, err := w.CreatePart(h)
		if err != nil {
			return nil, "", fmt.Errorf("cannot encode the message: %w", err)
		}
		r, err := f.Open()
		if err != nil {
			return nil, "", err
		}
		n, err := io.Copy(part, io.LimitReader(r, f.Size+1))
		r.Close()
		if err != nil || n != f.Size {
			return nil, "", fmt.Errorf("cannot read the reply's file %s (%d of %d bytes): %v", f.Name, n, f.Size, err)
		}
	}
	if err := w.Close(); err != nil {
		return nil, "", fmt.Errorf("cannot encode the message: %w", err)
	}
	return buf.Bytes(), w.FormDataContentType(), nil
}

func cutRunes(s string, n int) string {
	if r := []rune(s); len(r) > n {
		return string(r[:n])
	}
	return s
}

func cmpOr(s, d string) string {
	if strings.TrimSpace(s) == "" {
		return d
	}
	return s
}
