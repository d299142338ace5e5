package e2e

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"net/http"
	"strings"
	"testing"
	"time"
)

// A kubernetes run's files go through the pod's files container over the
// API server (ADR 29): a message's 3 MB file reaches the pod's workspace
// read-only under inbox/<message id>/ before the agent runs; a file the
// agent leaves in outbox/ arrives as an upload on the webhook, and a 2 GiB
// sparse file beside it is left out with a note, without hanging the run.
func TestKubernetesFilesInReachThePodAndTheAgentsFileArrivesAsAnUpload(t *testing.T) {
	k := newKubeEnv(t)
	s := startKube(t, k, "kfiles", k.image, "")
	payload := bytes.Repeat([]byte("berth-attachment-"), 3<<20/17) // ~3 MB
	sum := sha256.Sum256(payload)
	script := `/sh cd inbox/*/ && echo dir=$(pwd) && sha256sum x && (echo y >> x) 2>/dev/null; echo append=$?; cd /workspace && ` +
		`mkdir -p outbox && printf 'col\n42\n' > outbox/answer.csv && truncate -s 2G outbox/sparse.bin && echo wrote-it`
	status, id := s.postAny(t, map[string]any{"channel": "kfiles", "author": "tester", "text": script,
		"files": []map[string]string{{"name": "x", "type": "application/octet-stream", "base64": base64.StdEncoding.EncodeToString(payload)}}})
	if status != http.StatusAccepted {
		t.Fatalf("POST with a file: %d %s", status, id)
	}
	began := time.Now()
	reply := s.sink.wait(t, 3*time.Minute, id)[id]
	got := text(reply)
	if reply["state"] != "succeeded" {
		t.Fatalf("state %v error %v reply %q", reply["state"], reply["error"], got)
	}
	for _, want := range []string{"dir=/workspace/inbox/" + id, hex.EncodeToString(sum[:]) + "  x", "wrote-it", "x (application/octet-stream, 3145714 bytes)",
		"sparse.bin was not sent: it is 2048 MiB, more than the"} {
		if !strings.Contains(got, want) {
			t.Errorf("reply lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "append=0") {
		t.Errorf("the run could append to its attachment:\n%s", got)
	}
	files, _ := reply["files"].([]any)
	if len(files) != 1 {
		t.Fatalf("the reply carries %d files, want answer.csv only: %v", len(files), reply["files"])
	}
	f, _ := files[0].(map[string]any)
	data, _ := base64.StdEncoding.DecodeString(f["base64"].(string))
	if f["name"] != "answer.csv" || string(data) != "col\n42\n" {
		t.Errorf("upload %v with bytes %q, want answer.csv with col,42", f["name"], data)
	}
	if d := time.Since(began); d > 2*time.Minute {
		t.Errorf("the run took %s", d)
	}
}
