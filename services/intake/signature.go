package intake

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Signature headers of webhook requests and reply posts.
const (
	HeaderTimestamp = "X-Berth-Timestamp"
	HeaderSignature = "X-Berth-Signature"

	signaturePrefix = "sha256="
	// signatureWindow is how far a signed timestamp may be from now, either way.
	signatureWindow = 5 * time.Minute
)

var (
	errMissingSignature = errors.New("missing signature")
	errBadSignature     = errors.New("bad signature")
	errStaleTimestamp   = errors.New("stale timestamp")
)

// Sign returns the X-Berth-Signature value for body sent at timestamp: HMAC-SHA256
// over "<timestamp>.<body>". The timestamp is signed so that an old request
// cannot be replayed with a fresh one.
func Sign(secret []byte, timestamp int64, body []byte) string {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(strconv.FormatInt(timestamp, 10)))
	mac.Write([]byte("."))
	mac.Write(body)
	return signaturePrefix + hex.EncodeToString(mac.Sum(nil))
}

// SetSignature adds both signature headers for body to h.
func SetSignature(h http.Header, secret []byte, now time.Time, body []byte) {
	ts := now.Unix()
	h.Set(HeaderTimestamp, strconv.FormatInt(ts, 10))
	h.Set(HeaderSignature, Sign(secret, ts, body))
}

// verifySignature checks the signature headers of a request carrying body.
// The signature is checked before the clock so that only a holder of the
// secret learns that a timestamp is stale.
func verifySignature(h http.Header, secret []byte, now time.Time, body []byte) error {
	tsText, sig := h.Get(HeaderTimestamp), h.Get(HeaderSignature)
	if tsText == "" || sig == "" {
		return errMissingSignature
	}
	ts, err := strconv.ParseInt(tsText, 10, 64)
	if err != nil {
		return errBadSignature
	}
	got, ok := strings.CutPrefix(sig, signaturePrefix)
	if !ok {
		return errBadSignature
	}
	gotMAC, err := hex.DecodeString(got)
	if err != nil {
		return errBadSignature
	}
	want, _ := strings.CutPrefix(Sign(secret, ts, body), signaturePrefix)
	wantMAC, _ := hex.DecodeString(want)
	if !hmac.Equal(gotMAC, wantMAC) {
		return errBadSignature
	}
	if d := now.Sub(time.Unix(ts, 0)); d > signatureWindow || d < -signatureWindow {
		return errStaleTimestamp
	}
	return nil
}
