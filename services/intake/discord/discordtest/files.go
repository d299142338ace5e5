package discordtest

import (
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"strconv"
	"strings"
)

// Uploads as reference.mdx (Uploading Files) documents them: a
// multipart/form-data create-message request with a payload_json part (the
// JSON body) and a files[n] part per file, each matched by an entry of
// payload_json's attachments whose id is n. At most 10 files, and at most
// MaxRequestFiles of them together (a server without boosts): more is 413
// with code 40005, as Discord answers.

// MaxRequestFiles is the most bytes of files one request may carry.
const MaxRequestFiles = 10 << 20

// File is one attachment of a posted message.
type File struct {
	Name        string
	ContentType string
	Description string
	Data        []byte
}

func readMultipart(w http.ResponseWriter, r *http.Request, b *messageBody) bool {
	bad := func(msg string) bool {
		reply(w, http.StatusBadRequest, map[string]any{"message": "Invalid Form Body: " + msg, "code": 50035})
		return false
	}
	_, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	mr := multipart.NewReader(http.MaxBytesReader(w, r.Body, MaxRequestFiles+1<<20), params["boundary"])
	parts := map[int]File{}
	var payload []byte
	var total int
	for {
		p, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			return bad(err.Error())
		}
		data, err := io.ReadAll(p)
		if err != nil {
			reply(w, http.StatusRequestEntityTooLarge, map[string]any{"message": "Request entity too large", "code": 40005})
			return false
		}
		name := p.FormName()
		switch {
		case name == "payload_json":
			payload = data
		case strings.HasPrefix(name, "files[") && strings.HasSuffix(name, "]"):
			n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(name, "files["), "]"))
			if err != nil || n < 0 {
				return bad("bad part " + name)
			}
			total += len(data)
			parts[n] = File{Name: p.FileName(), ContentType: p.Header.Get("Content-Type"), Data: data}
		default:
			return bad("unknown part " + name)
		}
	}
	if payload == nil || json.Unmarshal(payload, b) != nil {
		return bad("payload_json is missing or not JSON")
	}
	if len(parts) > 10 {
		return bad("at most 10 files")
	}
	if total > MaxRequestFiles {
		reply(w, http.StatusRequestEntityTooLarge, map[string]any{"message": "Request entity too large", "code": 40005})
		return false
	}
	for _, a := range b.Attachments {
		n, err := strconv.Atoi(a.ID.String())
		f, ok := parts[n]
		if err != nil || !ok {
			return bad(fmt.Sprintf("attachment %s has no files[%s] part", a.ID, a.ID))
		}
		if a.Filename != "" {
			f.Name = a.Filename
		}
		f.Description = a.Description
		b.files = append(b.files, f)
		delete(parts, n)
	}
	if len(parts) > 0 {
		return bad("a files[n] part no attachment names")
	}
	return true
}
