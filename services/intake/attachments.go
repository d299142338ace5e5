package intake

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/durable"
	"github.com/berth-dev/berth/services/intake/connector"
)

// Inbound attachments (issue 26): intake downloads a message's files itself
// (the sandbox never does), caps them, and keeps them under
// <state>/attachments/<digest of the message key>/ until the scheduler has
// taken its own copy (SubmitFiles returns), then deletes them. A message
// whose files cannot be taken (too large, a refused type, a link that is
// gone) is stored with Refusal set: it runs nothing and its sender gets a
// reply saying why. Files are fsynced and their directory renamed into
// place before the message is stored, so nothing half-written is ever
// handed on; a directory left by a crash before the store is swept.

// attachmentsDir is where pending messages' files are kept.
const attachmentsDir = "attachments"

// attachmentTimeout bounds the download of one message's files.
const attachmentTimeout = 2 * time.Minute

// fileDir is the directory of the message key's files.
func (s *Service) fileDir(key string) string {
	sum := sha256.Sum256([]byte(key))
	return filepath.Join(s.stateDir, attachmentsDir, hex.EncodeToString(sum[:16]))
}

// errAttachmentRefused carries the reply text of files that cannot be
// taken, ever: the message is kept with it and runs nothing.
type errAttachmentRefused struct{ reply string }

func (e *errAttachmentRefused) Error() string { return e.reply }

func refusef(format string, args ...any) error {
	return &errAttachmentRefused{reply: fmt.Sprintf(format, args...)}
}

// takeAttachments downloads (or writes) in and keeps them for the message
// key. It returns the files kept; or the reply of a refusal (nothing kept);
// or an error when nothing was kept and the platform should deliver the
// message again (a download that failed for now, a full disk).
func (s *Service) takeAttachments(ctx context.Context, conn connector.Connector, key string, in []connector.Attachment) (files []storedFile, refusal string, err error) {
	if len(in) == 0 {
		return nil, "", nil
	}
	files, err = s.fetchAttachments(ctx, conn, key, in)
	if r, ok := errors.AsType[*errAttachmentRefused](err); ok {
		return nil, r.reply, nil
	}
	return files, "", err
}

func (s *Service) fetchAttachments(ctx context.Context, conn connector.Connector, key string, in []connector.Attachment) ([]storedFile, error) {
	lim := s.config().IntakeSettings()
	perFile, total := lim.AttachmentLimit(), lim.MessageAttachmentLimit()
	if len(in) > busapi.MaxFiles {
		return nil, refusef("This message has %d files; berth takes at most %d per message. Nothing was run.", len(in), busapi.MaxFiles)
	}
	if perFile == 0 || total == 0 {
		return nil, refusef("This berth takes no files ([intake] max_attachment_bytes = 0). Nothing was run.")
	}
	files := make([]storedFile, len(in))
	taken := map[string]bool{}
	for i, a := range in {
		name, err := busapi.CleanFileName(a.Name)
		if err != nil {
			name = "file-" + strconv.Itoa(i+1)
		}
		name = uniqueName(name, taken)
		files[i] = storedFile{Name: name, Type: mediaType(a.Type), Size: a.Size}
		if pat, ok := refusedType(lim.RefusedAttachmentTypes, files[i]); ok {
			return nil, refusef("The file %s is of a type this berth refuses (%s, matched by %q). Nothing was run.", name, typeOr(files[i].Type), pat)
		}
		if a.Size > perFile {
			return nil, refusef("The file %s is %s; this berth takes files of at most %s. Nothing was run.", name, humanBytes(a.Size), humanBytes(perFile))
		}
	}
	root := filepath.Join(s.stateDir, attachmentsDir)
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("cannot create the attachments directory: %w", err)
	}
	tmp, err := os.MkdirTemp(root, ".in-")
	if err != nil {
		return nil, fmt.Errorf("cannot keep the message's files: %w", err)
	}
	kept := false
	defer func() {
		if !kept {
			os.RemoveAll(tmp)
		}
	}()
	ctx, cancel := context.WithTimeout(ctx, attachmentTimeout)
	defer cancel()
	var sum int64
	for i, a := range in {
		n, sniffed, err := s.fetchOne(ctx, conn, a, filepath.Join(tmp, files[i].Name), min(perFile, total-sum))
		if errors.Is(err, errOverCap) {
			if sum+n > total && n <= perFile {
				return nil, refusef("This message's files come to more than %s; this berth takes at most %s per message. Nothing was run.", humanBytes(total), humanBytes(total))
			}
			return nil, refusef("The file %s is larger than %s, the most this berth takes per file. Nothing was run.", files[i].Name, humanBytes(perFile))
		}
		if err != nil {
			return nil, fmt.Errorf("file %s: %w", files[i].Name, err)
		}
		sum += n
		files[i].Size = n
		if files[i].Type == "" {
			files[i].Type = sniffed
			if pat, ok := refusedType(lim.RefusedAttachmentTypes, files[i]); ok {
				return nil, refusef("The file %s is of a type this berth refuses (%s, matched by %q). Nothing was run.", files[i].Name, files[i].Type, pat)
			}
		}
	}
	if err := durable.SyncDir(tmp); err != nil {
		return nil, err
	}
	dst := s.fileDir(key)
	// A directory of the same key was left by a crash before its message
	// was stored: this download replaces it.
	if err := os.RemoveAll(dst); err != nil {
		return nil, fmt.Errorf("cannot replace the files of an earlier try: %w", err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		return nil, fmt.Errorf("cannot keep the message's files: %w", err)
	}
	kept = true
	if err := durable.SyncDir(root); err != nil {
		os.RemoveAll(dst)
		return nil, err
	}
	return files, nil
}

var errOverCap = errors.New("over the size cap")

// fetchOne writes a's bytes to dst (fsynced), at most limit of them: more
// is errOverCap with the bytes counted so far. It returns the size and the
// media type the content sniffs as.
func (s *Service) fetchOne(ctx context.Context, conn connector.Connector, a connector.Attachment, dst string, limit int64) (int64, string, error) {
	var src io.Reader
	if a.Data != nil || a.URL == "" {
		if int64(len(a.Data)) > limit {
			return int64(len(a.Data)), "", errOverCap
		}
		src = strings.NewReader(string(a.Data))
	} else {
		body, err := s.download(ctx, conn, a)
		if err != nil {
			return 0, "", err
		}
		defer body.Close()
		src = body
	}
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return 0, "", fmt.Errorf("cannot keep the file: %w", err)
	}
	defer f.Close()
	sniff := &sniffer{}
	n, err := io.Copy(io.MultiWriter(f, sniff), io.LimitReader(src, limit+1))
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("the download took longer than %s: %w", attachmentTimeout, err)
		}
		return n, "", fmt.Errorf("cannot download the file: %w", err)
	}
	if n > limit {
		return n, "", errOverCap
	}
	if err := f.Sync(); err != nil {
		return n, "", fmt.Errorf("cannot keep the file: %w", err)
	}
	if err := f.Close(); err != nil {
		return n, "", fmt.Errorf("cannot keep the file: %w", err)
	}
	return n, mediaType(http.DetectContentType(sniff.b)), nil
}

// download GETs a's URL: as the connector signs the request when it needs
// its credentials, else plainly (http and https only).
func (s *Service) download(ctx context.Context, conn connector.Connector, a connector.Attachment) (io.ReadCloser, error) {
	var req *http.Request
	var err error
	if f, ok := conn.(connector.AttachmentFetcher); ok {
		req, err = f.AttachmentRequest(ctx, a)
	} else {
		req, err = http.NewRequestWithContext(ctx, http.MethodGet, a.URL, nil)
		if err == nil && req.URL.Scheme != "http" && req.URL.Scheme != "https" {
			err = fmt.Errorf("the link %q is not http or https", a.URL)
		}
	}
	if err != nil {
		return nil, refusef("The file %s cannot be downloaded: %v. Nothing was run.", a.Name, err)
	}
	resp, err := s.attachClient().Do(req)
	if err != nil {
		return nil, fmt.Errorf("cannot download the file: %w", err)
	}
	switch {
	case resp.StatusCode == http.StatusOK:
		return resp.Body, nil
	case resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusRequestTimeout:
		resp.Body.Close()
		return nil, fmt.Errorf("cannot download the file: the platform answered %s", resp.Status)
	default:
		resp.Body.Close()
		return nil, refusef("The file %s cannot be downloaded: the platform answered %s. Nothing was run.", a.Name, resp.Status)
	}
}

// attachClient sends downloads: no overall timeout of its own (the
// message's deadline bounds it), and no redirect to another scheme.
func (s *Service) attachClient() *http.Client {
	return &http.Client{
		Transport: s.httpClient.Transport,
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) >= 5 {
				return errors.New("too many redirects")
			}
			if req.URL.Scheme != "http" && req.URL.Scheme != "https" {
				return fmt.Errorf("redirect to %q", req.URL.Scheme)
			}
			// A redirect to another host carries no credentials (net/http
			// drops Authorization across hosts).
			return nil
		},
	}
}

// openFiles opens a pending message's kept files for SubmitFiles.
func (s *Service) openFiles(m inboxEntry) ([]busapi.File, error) {
	dir := s.fileDir(m.Key())
	out := make([]busapi.File, 0, len(m.Files))
	for _, f := range m.Files {
		fh, err := os.Open(filepath.Join(dir, f.Name))
		if err != nil {
			busapi.CloseFiles(out)
			return nil, fmt.Errorf("cannot open the message's file %s: %w", f.Name, err)
		}
		out = append(out, busapi.File{Name: f.Name, Type: f.Type, Size: f.Size, Open: fh})
	}
	return out, nil
}

// dropFiles deletes the kept files of a message the scheduler has taken
// (or that was refused): the scheduler holds its own copy.
func (s *Service) dropFiles(m inboxEntry) {
	if len(m.Files) == 0 {
		return
	}
	if err := os.RemoveAll(s.fileDir(m.Key())); err != nil {
		s.log.Warn("cannot delete a handed-on message's files; the sweep tries again", "connector", m.Connector, "message_id", m.ID, "err", err)
	}
}

// sweepFiles deletes file directories no pending message owns: downloads a
// crash cut off, and files of messages handed on before a crash let
// dropFiles run.
func (s *Service) sweepFiles() error {
	root := filepath.Join(s.stateDir, attachmentsDir)
	ents, err := os.ReadDir(root)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("cannot sweep the attachments directory: %w", err)
	}
	pending, err := s.store.pendingMessages()
	if err != nil {
		return err
	}
	keep := map[string]bool{}
	for _, m := range pending {
		if len(m.Files) > 0 {
			keep[filepath.Base(s.fileDir(m.Key()))] = true
		}
	}
	for _, e := range ents {
		if !keep[e.Name()] {
			os.RemoveAll(filepath.Join(root, e.Name()))
		}
	}
	return nil
}

func uniqueName(name string, taken map[string]bool) string {
	ext := filepath.Ext(name)
	stem := strings.TrimSuffix(name, ext)
	for i := 2; taken[name]; i++ {
		name = stem + "-" + strconv.Itoa(i) + ext
	}
	taken[name] = true
	return name
}

// mediaType is t without its parameters, lower case.
func mediaType(t string) string {
	t, _, _ = strings.Cut(t, ";")
	return strings.ToLower(strings.TrimSpace(t))
}

func typeOr(t string) string {
	if t == "" {
		return "unknown type"
	}
	return t
}

// refusedType is the first of patterns f's media type or name matches.
func refusedType(patterns []string, f storedFile) (string, bool) {
	for _, p := range patterns {
		if m, _ := path.Match(p, f.Type); m && f.Type != "" {
			return p, true
		}
		if m, _ := path.Match(strings.ToLower(p), strings.ToLower(f.Name)); m {
			return p, true
		}
	}
	return "", false
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<20:
		return strconv.FormatFloat(float64(n)/(1<<20), 'f', 1, 64) + " MiB"
	case n >= 1<<10:
		return strconv.FormatFloat(float64(n)/(1<<10), 'f', 1, 64) + " KiB"
	}
	return strconv.FormatInt(n, 10) + " bytes"
}

// sniffer keeps the first 512 bytes written, for http.DetectContentType.
type sniffer struct{ b []byte }

func (s *sniffer) Write(p []byte) (int, error) {
	if room := 512 - len(s.b); room > 0 {
		s.b = append(s.b, p[:min(room, len(p))]...)
	}
	return len(p), nil
}
