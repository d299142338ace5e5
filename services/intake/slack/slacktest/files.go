package slacktest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"strconv"
	"strings"
)

// The files upload v2 flow as api.slack.com documents it
// (methods/files.getUploadURLExternal: filename, length, answering
// upload_url and file_id; then a POST of the bytes to upload_url, raw or as
// a multipart form with a "file" part; methods/files.completeUploadExternal:
// files as a JSON array of {id, title}, channel_id, thread_ts,
// initial_comment). An upload whose bytes differ from its length, or a
// completion naming a file never uploaded, is refused, so a test can tell
// berth spoke the flow as Slack takes it.

// Upload is one files.completeUploadExternal the fake answered ok.
type Upload struct {
	Channel        string
	ThreadTS       string
	InitialComment string
	Files          []UploadedFile
}

// UploadedFile is one file of an Upload.
type UploadedFile struct {
	ID, Name, Title string
	Data            []byte
}

type fileState struct {
	pending map[string]*UploadedFile // file id → declared, maybe uploaded
	length  map[string]int
	done    map[string]bool // bytes received
	uploads []Upload
}

func (s *Server) handleFiles(mux *http.ServeMux) {
	s.files = fileState{pending: map[string]*UploadedFile{}, length: map[string]int{}, done: map[string]bool{}}
	mux.HandleFunc("POST /api/files.getUploadURLExternal", s.getUploadURL)
	mux.HandleFunc("POST /api/files.completeUploadExternal", s.completeUpload)
	mux.HandleFunc("POST /upload/{id}", s.uploadBytes)
}

// Uploads lists the completed uploads, in order.
func (s *Server) Uploads() []Upload {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Upload(nil), s.files.uploads...)
}

// WaitUploads waits until n uploads completed.
func (s *Server) WaitUploads(ctx context.Context, n int) ([]Upload, error) {
	err := s.wait(ctx, func() bool { return len(s.files.uploads) >= n })
	return s.Uploads(), err
}

func (s *Server) getUploadURL(w http.ResponseWriter, r *http.Request) {
	_ = r.ParseForm()
	if token(r) != s.o.BotToken {
		refuse(w, "invalid_auth")
		return
	}
	name := r.PostForm.Get("filename")
	length, err := strconv.Atoi(r.PostForm.Get("length"))
	if name == "" || err != nil || length <= 0 {
		refuse(w, "missing_argument")
		return
	}
	s.mu.Lock()
	s.seq++
	id := fmt.Sprintf("F%06d", s.seq)
	s.files.pending[id] = &UploadedFile{ID: id, Name: name}
	s.files.length[id] = length
	s.mu.Unlock()
	reply(w, map[string]any{"ok": true, "upload_url": s.srv.URL + "/upload/" + id, "file_id": id})
}

func (s *Server) uploadBytes(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	data, err := uploadedBytes(r)
	s.mu.Lock()
	defer s.mu.Unlock()
	f, ok := s.files.pending[id]
	switch {
	case !ok:
		http.Error(w, "unknown upload", http.StatusNotFound)
	case err != nil:
		http.Error(w, err.Error(), http.StatusBadRequest)
	case len(data) != s.files.length[id]:
		http.Error(w, fmt.Sprintf("got %d bytes, the upload URL was for %d", len(data), s.files.length[id]), http.StatusBadRequest)
	default:
		f.Data = data
		s.files.done[id] = true
		_, _ = fmt.Fprintf(w, "OK - %d", len(data))
	}
}

// uploadedBytes reads an upload's body: a multipart form's "file" part, or
// the raw bytes.
func uploadedBytes(r *http.Request) ([]byte, error) {
	mt, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if !strings.HasPrefix(mt, "multipart/") {
		return io.ReadAll(io.LimitReader(r.Body, 1<<30))
	}
	mr := multipart.NewReader(r.Body, params["boundary"])
	for {
		p, err := mr.NextPart()
		if err != nil {
			return nil, fmt.Errorf("no file part: %w", err)
		}
		if p.FormName() == "file" {
			return io.ReadAll(io.LimitReader(p, 1<<30))
		}
	}
}

func (s *Server) completeUpload(w http.ResponseWriter, r *http.Request) {
	_ = r.ParseForm()
	if token(r) != s.o.BotToken {
		refuse(w, "invalid_auth")
		return
	}
	var files []struct {
		ID    string `json:"id"`
		Title string `json:"title"`
	}
	if err := json.Unmarshal([]byte(r.PostForm.Get("files")), &files); err != nil || len(files) == 0 {
		refuse(w, "invalid_arguments")
		return
	}
	channel := r.PostForm.Get("channel_id")
	s.mu.Lock()
	if code := s.refusals[channel]; code != "" {
		s.mu.Unlock()
		refuse(w, code)
		return
	}
	up := Upload{Channel: channel, ThreadTS: r.PostForm.Get("thread_ts"), InitialComment: r.PostForm.Get("initial_comment")}
	var answer []map[string]any
	for _, f := range files {
		pf, ok := s.files.pending[f.ID]
		if !ok || !s.files.done[f.ID] {
			s.mu.Unlock()
			refuse(w, "file_not_found")
			return
		}
		up.Files = append(up.Files, UploadedFile{ID: f.ID, Name: pf.Name, Title: f.Title, Data: pf.Data})
		answer = append(answer, map[string]any{"id": f.ID, "title": f.Title})
	}
	for _, f := range files {
		delete(s.files.pending, f.ID)
	}
	s.files.uploads = append(s.files.uploads, up)
	s.notify()
	s.mu.Unlock()
	reply(w, map[string]any{"ok": true, "files": answer})
}
