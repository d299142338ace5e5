package meepachattest

import (
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
)

// Uploads as MeepaChat's bot clients make them (openclaw/src/http-client.ts
// in the MeepaChat repository): POST /api/attachments/presign with
// {"filename", "mimeType"} answers {"data": {"uploadId", "uploadUrl"}};
// PUT /api/attachments/upload/{uploadId} with a multipart form whose "file"
// part holds the bytes answers {"data": {"uploadId"}}; a message then names
// its files in "attachmentIds". A file over MaxUpload is 413, an
// attachmentIds entry never uploaded (or used before) 400.

// MaxUpload is the largest file the fake takes (MeepaChat's 25 MB).
const MaxUpload = 25 << 20

// Attachment is one file of a posted message.
type Attachment struct {
	ID       string
	Filename string
	MimeType string
	Data     []byte
}

type upload struct {
	Attachment
	done bool
}

func (f *Fake) handleFiles(mux *http.ServeMux) {
	mux.HandleFunc("POST /api/attachments/presign", f.presign)
	mux.HandleFunc("PUT /api/attachments/upload/{id}", f.uploadFile)
}

func (f *Fake) presign(w http.ResponseWriter, r *http.Request) {
	if !f.authorized(r) {
		writeJSON(w, http.StatusUnauthorized, envelope{Error: "invalid bot token"})
		return
	}
	var body struct {
		Filename string `json:"filename"`
		MimeType string `json:"mimeType"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16)).Decode(&body); err != nil || body.Filename == "" {
		writeJSON(w, http.StatusBadRequest, envelope{Error: "filename is required"})
		return
	}
	f.mu.Lock()
	f.nextID++
	id := fmt.Sprintf("up-%d", f.nextID)
	if f.uploads == nil {
		f.uploads = map[string]*upload{}
	}
	f.uploads[id] = &upload{Attachment: Attachment{ID: id, Filename: body.Filename, MimeType: body.MimeType}}
	f.mu.Unlock()
	writeJSON(w, http.StatusOK, envelope{Data: map[string]string{"uploadId": id, "uploadUrl": f.URL + "/api/attachments/upload/" + id}})
}

func (f *Fake) uploadFile(w http.ResponseWriter, r *http.Request) {
	if !f.authorized(r) {
		writeJSON(w, http.StatusUnauthorized, envelope{Error: "invalid bot token"})
		return
	}
	id := r.PathValue("id")
	mt, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if mt != "multipart/form-data" {
		writeJSON(w, http.StatusBadRequest, envelope{Error: "expected multipart/form-data"})
		return
	}
	mr := multipart.NewReader(http.MaxBytesReader(w, r.Body, MaxUpload+1<<20), params["boundary"])
	var data []byte
	for {
		p, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			writeJSON(w, http.StatusRequestEntityTooLarge, envelope{Error: "file too large"})
			return
		}
		if p.FormName() == "file" {
			if data, err = io.ReadAll(io.LimitReader(p, MaxUpload+1)); err != nil {
				writeJSON(w, http.StatusBadRequest, envelope{Error: "cannot read the file"})
				return
			}
		}
	}
	if len(data) > MaxUpload {
		writeJSON(w, http.StatusRequestEntityTooLarge, envelope{Error: "file too large"})
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	u, ok := f.uploads[id]
	if !ok || data == nil {
		writeJSON(w, http.StatusBadRequest, envelope{Error: "unknown upload or no file part"})
		return
	}
	u.Data, u.done = data, true
	writeJSON(w, http.StatusOK, envelope{Data: map[string]string{"uploadId": id}})
}

// takeAttachmentsLocked resolves a message's attachmentIds; false when one
// is unknown, not uploaded, or taken by an earlier message.
func (f *Fake) takeAttachmentsLocked(ids []string) ([]Attachment, bool) {
	var out []Attachment
	for _, id := range ids {
		u, ok := f.uploads[id]
		if !ok || !u.done {
			return nil, false
		}
		out = append(out, u.Attachment)
	}
	for _, id := range ids {
		delete(f.uploads, id)
	}
	return out, true
}
