package meepachattest

import (
	"fmt"
	"net/http"
)

// StoredFile is an attachment object of an inbound message, as MeepaChat
// sends it: the file is downloaded from {base}/{storedPath} with the bot
// token.
type StoredFile struct {
	ID         string `json:"id"`
	Filename   string `json:"filename"`
	StoredPath string `json:"storedPath"`
	MimeType   string `json:"mimeType"`
	SizeBytes  int64  `json:"sizeBytes"`
}

// Store keeps a file a user attached and returns its attachment object.
func (f *Fake) Store(name, mimeType string, data []byte) StoredFile {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nextID++
	id := fmt.Sprintf("att-%d", f.nextID)
	path := "/uploads/" + id + "/" + name
	if f.stored == nil {
		f.stored = map[string][]byte{}
	}
	f.stored[path] = data
	return StoredFile{ID: id, Filename: name, StoredPath: path, MimeType: mimeType, SizeBytes: int64(len(data))}
}

// Downloads counts the stored files served to a bot.
func (f *Fake) Downloads() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.downloads
}

// storedFile serves a stored file, to the bot token only (MeepaChat
// answers anyone else 401).
func (f *Fake) storedFile(w http.ResponseWriter, r *http.Request) {
	if !f.authorized(r) {
		writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "unauthorized"})
		return
	}
	f.mu.Lock()
	data, ok := f.stored[r.URL.Path]
	if ok {
		f.downloads++
	}
	f.mu.Unlock()
	if !ok {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "not found"})
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	_, _ = w.Write(data)
}

// Client is an HTTP client that trusts the fake (its TLS certificate too).
func (f *Fake) Client() *http.Client { return f.srv.Client() }
