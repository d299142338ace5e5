package meepachat

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

// Uploads as MeepaChat's bot clients make them (openclaw/src/http-client.ts
// in the MeepaChat repository): POST /api/attachments/presign {filename,
// mimeType} → {uploadId, uploadUrl}; PUT /api/attachments/upload/{uploadId}
// with a multipart "file" part; then a message with attachmentIds. MeepaChat
// takes files up to 25 MB; berth puts at most 10 in one message.
const (
	maxFileBytes       = 25 << 20
	maxFilesPerMessage = 10
)

var fileLimits = connector.FileLimits{Platform: "MeepaChat", MaxFileBytes: maxFileBytes}

func fileBatches(files []connector.File) [][]connector.File {
	var out [][]connector.File
	for len(files) > 0 {
		n := min(len(files), maxFilesPerMessage)
		out, files = append(out, files[:n]), files[n:]
	}
	return out
}

// postFiles uploads a batch and posts the message that carries it, its
// captions as the content (the files' names when none has one). A file
// MeepaChat refuses for good is left out with a note in that message.
func (c *Connector) postFiles(ctx context.Context, path, thread string, files []connector.File) error {
	var ids, notes []string
	var sent []connector.File
	for _, f := range files {
		id, err := c.uploadFile(ctx, f)
		if connector.IsPermanent(err) {
			notes = append(notes, f.Name+" was not sent: "+err.Error())
			continue
		}
		if err != nil {
			return err
		}
		ids, sent = append(ids, id), append(sent, f)
	}
	content := connector.FileCaptions(sent)
	if content == "" && len(sent) > 0 {
		names := make([]string, len(sent))
		for i, f := range sent {
			names[i] = f.Name
		}
		content = strings.Join(names, ", ")
	}
	content = connector.WithNotes(content, notes)
	if r := []rune(content); len(r) > maxContent {
		content = string(r[:maxContent])
	}
	return c.postChunk(ctx, path, content, thread, ids)
}

// uploadFile presigns an upload and PUTs the file's bytes; it returns the
// upload id a message names.
func (c *Connector) uploadFile(ctx context.Context, f connector.File) (string, error) {
	presign, err := json.Marshal(map[string]string{"filename": f.Name, "mimeType": f.Type})
	if err != nil {
		return "", fmt.Errorf("cannot encode the upload: %w", err)
	}
	var up struct {
		UploadID string `json:"uploadId"`
	}
	if err := c.call(ctx, http.MethodPost, "/api/attachments/presign", presign, "application/json", &up); err != nil {
		return "", fmt.Errorf("cannot presign the upload of %s: %w", f.Name, err)
	}
	if up.UploadID == "" {
		return "", fmt.Errorf("meepachat answered the presign of %s without an uploadId", f.Name)
	}
	body, contentType, err := fileForm(f)
	if err != nil {
		return "", err
	}
	if err := c.call(ctx, http.MethodPut, "/api/attachments/upload/"+url.PathEscape(up.UploadID), body, contentType, nil); err != nil {
		return "", fmt.Errorf("cannot upload %s: %w", f.Name, err)
	}
	return up.UploadID, nil
}

// call makes one upload request and reads its data into out (nil: ignored).
func (c *Connector) call(ctx context.Context, method, path string, body []byte, contentType string, out any) error {
	status, header, apiErr, data, err := c.request(ctx, method, path, body, contentType)
	switch {
	case err != nil:
		return err
	case status == http.StatusTooManyRequests:
		return &connector.RetryAfterError{After: retryAfter(header.Get("Retry-After"), c.clock.Now()), Err: fmt.Errorf("meepachat rate limit (HTTP 429)")}
	case status >= 400 && status < 500 && status != http.StatusUnauthorized && status != http.StatusRequestTimeout:
		return &connector.PermanentError{Reason: fmt.Sprintf("meepachat refused it (HTTP %d): %s", status, orDefault(apiErr, http.StatusText(status)))}
	case status < 200 || status > 299:
		return fmt.Errorf("meepachat answered HTTP %d: %s", status, orDefault(apiErr, http.StatusText(status)))
	}
	if out != nil && json.Unmarshal(data, out) != nil {
		return fmt.Errorf("meepachat answered %s %s with unreadable data", method, path)
	}
	return nil
}

// fileForm is a multipart form whose "file" part holds f's bytes.
func fileForm(f connector.File) ([]byte, string, error) {
	r, err := f.Open()
	if err != nil {
		return nil, "", err
	}
	defer r.Close()
	var buf bytes.Buffer
	w := multipart.NewWriter(&buf)
	h := textproto.MIMEHeader{}
	h.Set("Content-Disposition", multipart.FileContentDisposition("file", f.Name))
	h.Set("Content-Type", orDefault(f.Type, "application/octet-stream"))
	part, err := w.CreatePart(h)
	if err != nil {
		return nil, "", fmt.Errorf("cannot encode the upload of %s: %w", f.Name, err)
	}
	if n, err := io.Copy(part, io.LimitReader(r, f.Size+1)); err != nil || n != f.Size {
		return nil, "", fmt.Errorf("cannot read the reply's file %s (%d of %d bytes): %v", f.Name, n, f.Size, err)
	}
	if err := w.Close(); err != nil {
		return nil, "", fmt.Errorf("cannot encode the upload of %s: %w", f.Name, err)
	}
	return buf.Bytes(), w.FormDataContentType(), nil
}
