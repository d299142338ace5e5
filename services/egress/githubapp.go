package egress

import (
	"bytes"
	"context"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/berth-dev/berth/internal/egresspolicy"
)

// GitHubApp is an [[egress.github_apps]] entry, private key included: the
// proxy mints the run's installation tokens with it.
type GitHubApp = egresspolicy.GitHubApp

// tokenRefreshMargin is how long before its end a token is replaced:
// a fetch or push begun with it has that long to finish.
const tokenRefreshMargin = 10 * time.Minute

// appTokens are one app's installation tokens for one run: minted when
// first needed, restricted to the run's repositories and the permission its
// rules need, replaced before they expire, and all revoked at the run's end.
// They live in the proxy's memory only.
type appTokens struct {
	app     GitHubApp
	key     *rsa.PrivateKey
	repos   []string // repository names; nil is every one of the installation
	perm    string   // contents: read or write
	client  *http.Client
	timeout time.Duration

	mu       sync.Mutex
	token    string
	expires  time.Time
	minting  chan struct{} // closed when the mint under way ends
	issued   []string      // every token minted, revoked by close
	lastErr  error
	revoking bool
}

func newAppTokens(app GitHubApp, rules []egresspolicy.GitRule, client *http.Client, timeout time.Duration) (*appTokens, error) {
	key, err := jwt.ParseRSAPrivateKeyFromPEM([]byte(app.PrivateKey))
	if err != nil {
		return nil, fmt.Errorf("cannot read the private key of GitHub app %s: %w", app.Name, err)
	}
	t := &appTokens{app: app, key: key, perm: "read", client: client, timeout: timeout}
	all := false
	for _, r := range rules {
		if r.Credential != app.Name {
			continue
		}
		if len(r.Push) > 0 {
			t.perm = "write"
		}
		rem, err := egresspolicy.ParseGitRemote(r.Remote)
		if err != nil {
			return nil, err
		}
		name := path.Base(rem.Repo)
		// A glob names no repository the token could be restricted to.
		if strings.Contains(rem.Repo, "*") {
			all = true
		} else if !slices.Contains(t.repos, name) {
			t.repos = append(t.repos, name)
		}
	}
	if all {
		t.repos = nil
	}
	return t, nil
}

// get is a token valid for tokenRefreshMargin at least, minted if need be.
func (t *appTokens) get(ctx context.Context) (string, error) {
	for {
		t.mu.Lock()
		if t.revoking {
			t.mu.Unlock()
			return "", errors.New("the run has ended")
		}
		if t.token != "" && time.Until(t.expires) > tokenRefreshMargin {
			tok := t.token
			t.mu.Unlock()
			return tok, nil
		}
		if wait := t.minting; wait != nil {
			t.mu.Unlock()
			select {
			case <-wait:
			case <-ctx.Done():
				return "", context.Cause(ctx)
			}
			t.mu.Lock()
			err := t.lastErr
			t.mu.Unlock()
			if err != nil {
				return "", err
			}
			continue
		}
		done := make(chan struct{})
		t.minting = done
		t.mu.Unlock()
		// Not cancelled with the request that happens to mint: others wait
		// on it (the call has its own deadline).
		tok, expires, err := t.mint(context.WithoutCancel(ctx))
		t.mu.Lock()
		t.minting, t.lastErr = nil, err
		if err == nil {
			// A replaced token is kept until close revokes it: a transfer
			// begun with it may still be under way.
			t.token, t.expires = tok, expires
			t.issued = append(t.issued, tok)
		}
		t.mu.Unlock()
		close(done)
		if err != nil {
			return "", err
		}
		return tok, nil
	}
}

// appJWT is the app's own short proof (RS256, GitHub allows 10 minutes),
// issued a minute in the past for clock skew.
func (t *appTokens) appJWT() (string, error) {
	now := time.Now()
	claims := jwt.RegisteredClaims{
		Issuer:    strconv.FormatInt(t.app.AppID, 10),
		IssuedAt:  jwt.NewNumericDate(now.Add(-time.Minute)),
		ExpiresAt: jwt.NewNumericDate(now.Add(9 * time.Minute)),
	}
	return jwt.NewWithClaims(jwt.SigningMethodRS256, claims).SignedString(t.key)
}

type accessTokenRequest struct {
	Repositories []string          `json:"repositories,omitempty"`
	Permissions  map[string]string `json:"permissions"`
}

type accessTokenResponse struct {
	Token     string    `json:"token"`
	ExpiresAt time.Time `json:"expires_at"`
}

// mint asks GitHub for an installation token (POST
// /app/installations/{id}/access_tokens).
func (t *appTokens) mint(ctx context.Context) (string, time.Time, error) {
	fail := func(err error) (string, time.Time, error) {
		return "", time.Time{}, fmt.Errorf("cannot get a token of GitHub app %s: %w", t.app.Name, err)
	}
	signed, err := t.appJWT()
	if err != nil {
		return fail(err)
	}
	body, _ := json.Marshal(accessTokenRequest{Repositories: t.repos, Permissions: map[string]string{"contents": t.perm}})
	u := fmt.Sprintf("%s/app/installations/%d/access_tokens", t.app.API(), t.app.InstallationID)
	resp, err := t.call(ctx, http.MethodPost, u, "Bearer "+signed, body)
	if err != nil {
		return fail(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return fail(apiError(resp))
	}
	var out accessTokenResponse
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&out); err != nil || out.Token == "" {
		return fail(errors.New("the answer holds no token"))
	}
	if out.ExpiresAt.IsZero() {
		out.ExpiresAt = time.Now().Add(time.Hour)
	}
	return out.Token, out.ExpiresAt, nil
}

// close revokes every token minted for the run (DELETE
// /installation/token); later gets fail.
func (t *appTokens) close(ctx context.Context) error {
	t.mu.Lock()
	t.revoking = true
	issued := t.issued
	t.issued, t.token = nil, ""
	t.mu.Unlock()
	var errs []error
	for _, tok := range issued {
		resp, err := t.call(ctx, http.MethodDelete, t.app.API()+"/installation/token", "Bearer "+tok, nil)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		// 401: it expired already, which is as good.
		if resp.StatusCode != http.StatusNoContent && resp.StatusCode != http.StatusUnauthorized {
			errs = append(errs, apiError(resp))
		}
		resp.Body.Close()
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cannot revoke the tokens of GitHub app %s: %w", t.app.Name, err)
	}
	return nil
}

func (t *appTokens) call(ctx context.Context, method, url, auth string, body []byte) (*http.Response, error) {
	ctx, cancel := context.WithTimeout(ctx, t.timeout)
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
	if err != nil {
		cancel()
		return nil, err
	}
	setGitHubHeaders(req, auth)
	resp, err := t.client.Do(req)
	if err != nil {
		cancel()
		return nil, err
	}
	resp.Body = cancelOnClose{resp.Body, cancel}
	return resp, nil
}

func setGitHubHeaders(req *http.Request, auth string) {
	req.Header.Set("Accept", "application/vnd.github+json")
	req.Header.Set("X-GitHub-Api-Version", "2022-11-28")
	req.Header.Set("User-Agent", "berth-egress")
	req.Header.Set("Authorization", auth)
	if req.ContentLength > 0 {
		req.Header.Set("Content-Type", "application/json")
	}
}

type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (c cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.cancel()
	return err
}

// apiError is a GitHub API refusal as a sentence: its status and message.
func apiError(resp *http.Response) error {
	var body struct {
		Message string `json:"message"`
	}
	json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&body)
	if body.Message != "" {
		return fmt.Errorf("GitHub answered %s: %s", resp.Status, body.Message)
	}
	return fmt.Errorf("GitHub answered %s", resp.Status)
}

// forgeAncestry asks GitHub's compare API whether base is an ancestor of
// head in repo ("owner/name"): status "ahead" or "identical" says so.
func forgeAncestry(ctx context.Context, client *http.Client, timeout time.Duration, api, repo, auth, base, head string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	u := fmt.Sprintf("%s/repos/%s/compare/%s...%s", api, repo, base, head)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return false, err
	}
	setGitHubHeaders(req, auth)
	resp, err := client.Do(req)
	if err != nil {
		return false, fmt.Errorf("cannot ask the forge: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false, fmt.Errorf("cannot ask the forge: %w", apiError(resp))
	}
	status, err := topLevelString(io.LimitReader(resp.Body, 16<<20), "status")
	if err != nil {
		return false, fmt.Errorf("cannot read the forge's answer: %w", err)
	}
	switch status {
	case "ahead", "identical":
		return true, nil
	case "behind", "diverged":
		return false, nil
	}
	return false, fmt.Errorf("the forge's compare status %q is not one it documents", status)
}

// topLevelString reads a JSON object up to its top-level key and returns
// that key's string: a compare answer lists commits and files after it.
func topLevelString(r io.Reader, key string) (string, error) {
	dec := json.NewDecoder(r)
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return "", errors.New("not a JSON object")
	}
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return "", err
		}
		if k == key {
			var v string
			if err := dec.Decode(&v); err != nil {
				return "", fmt.Errorf("%s is not a string", key)
			}
			return v, nil
		}
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return "", err
		}
	}
	return "", fmt.Errorf("no %s in it", key)
}
