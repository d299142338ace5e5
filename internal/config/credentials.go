package config

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
)

// Connector credentials are written as references, never as the secret:
//
//	token = "$DISCORD_TOKEN"        the service's environment
//	token = "discord-token"         $CREDENTIALS_DIRECTORY/discord-token (systemd LoadCredential=)
//	token = "/etc/berth/slack.tok"  that file, read as is
//
// A value that looks like a token written in clear is a config error, so a
// secret never sits in a world-readable berth.toml by mistake.

// credentialsDirEnv is where systemd puts the files of LoadCredential=.
const credentialsDirEnv = "CREDENTIALS_DIRECTORY"

// credentialNamePattern is what systemd accepts as a credential name.
var credentialNamePattern = regexp.MustCompile(`^[A-Za-z0-9_.@-]{1,255}$`)

var (
	// slackTokenPrefixes start Slack's tokens (bot, user, app, refresh, ...).
	slackTokenPrefixes = []string{"xoxb-", "xoxp-", "xoxa-", "xoxe-", "xoxs-", "xoxr-", "xapp-"}
	// keyRun is a long run of base64 characters. Credential names are words
	// joined by '-', '_' or '.'; Discord tokens, MeepaChat's
	// "<bot_id>.<secret>" and Slack's signing secrets all hold such a run.
	keyRun    = regexp.MustCompile(`[A-Za-z0-9+/=]{20,}`)
	hasDigit  = regexp.MustCompile(`[0-9]`)
	hasLetter = regexp.MustCompile(`[A-Za-z]`)
)

// credentialKeys are the connector keys that hold credential references:
// those Connector's tags check as one, in field order.
var credentialKeys = func() []string {
	var keys []string
	for _, f := range specsOf(reflect.TypeFor[Connector]()) {
		if f.check == "credential" {
			keys = append(keys, f.key)
		}
	}
	return keys
}()

// looksLikeSecret tells whether a credential value is probably the secret
// itself rather than a reference to it.
func looksLikeSecret(s string) bool {
	for _, p := range slackTokenPrefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	for _, run := range keyRun.FindAllString(s, -1) {
		if hasDigit.MatchString(run) && hasLetter.MatchString(run) {
			return true
		}
	}
	return false
}

// checkCredentialRef explains why a credential value is not a reference, or
// returns "". The message never repeats the value: it may be a secret.
func checkCredentialRef(s string) string {
	const how = `write "$VARIABLE" to read it from the service's environment, a credential name (systemd LoadCredential=NAME:/path/to/file, read from $CREDENTIALS_DIRECTORY) or an absolute file path`
	switch {
	case s == "":
		return "must not be empty: " + how
	case strings.HasPrefix(s, "$"):
		if !envNamePattern.MatchString(s[1:]) {
			return "is not a valid reference: after $ comes an environment variable name (letters, digits, _)"
		}
		return ""
	case filepath.IsAbs(s):
		if filepath.Clean(s) != s {
			return "is not a clean absolute path"
		}
		return ""
	case looksLikeSecret(s):
		return "looks like a secret written in clear; it is refused so that it never sits in the config: " + how
	case !credentialNamePattern.MatchString(s):
		return "is not a credential reference: " + how
	}
	return ""
}

// CredentialRef returns the reference a connector holds for a credential
// key (CredToken, CredAppToken, CredBotToken, CredSigningSecret).
func (c Connector) CredentialRef(key string) (string, error) {
	v := reflect.ValueOf(c)
	for _, f := range specsOf(v.Type()) {
		if f.check == "credential" && f.key == key {
			return v.Field(f.index).String(), nil
		}
	}
	return "", fmt.Errorf("connector %q: %s is not a credential key (keys: %s)", c.ID, key, strings.Join(credentialKeys, ", "))
}

// Credential resolves one of the connector's credentials: "$VAR" with
// getenv, a credential name against $CREDENTIALS_DIRECTORY (also read with
// getenv), an absolute path as is; a file's trailing newline is dropped.
// A missing or empty credential is an error naming the connector and the
// key; no error ever contains the credential.
func (c Connector) Credential(key string, getenv func(string) string) (string, error) {
	ref, err := c.CredentialRef(key)
	if err != nil {
		return "", err
	}
	fail := func(format string, args ...any) error {
		return fmt.Errorf("connector %q: %s: "+format, append([]any{c.ID, key}, args...)...)
	}
	if ref == "" {
		return "", fail("is not set")
	}
	if name, ok := strings.CutPrefix(ref, "$"); ok {
		v := getenv(name)
		if v == "" {
			return "", fail("environment variable %s is not set or empty", name)
		}
		return v, nil
	}
	file := ref
	if !filepath.IsAbs(ref) {
		if !credentialNamePattern.MatchString(ref) {
			return "", fail("is not a credential reference")
		}
		dir := getenv(credentialsDirEnv)
		if dir == "" {
			return "", fail("credential %q cannot be read: $%s is not set (add LoadCredential=%s:/path/to/file to the unit with a drop-in)", ref, credentialsDirEnv, ref)
		}
		file = filepath.Join(dir, ref)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "", fail("credential file %s does not exist", file)
		}
		return "", fail("cannot read credential file: %w", err)
	}
	data = bytes.TrimRight(data, "\r\n")
	if len(data) == 0 {
		return "", fail("credential file %s is empty", file)
	}
	return string(data), nil
}

// Credentials returns the credential keys a connector has set, in a fixed
// order.
func (c Connector) Credentials() []string {
	var keys []string
	for _, k := range credentialKeys {
		if ref, _ := c.CredentialRef(k); ref != "" {
			keys = append(keys, k)
		}
	}
	return keys
}

// CheckCredentials resolves every credential of every connector (and the
// secret of every webhook), as intake does at start and on reload, so a
// missing or empty one refuses the configuration. The error names each
// connector and key that failed, never a value.
func CheckCredentials(cfg *Config, getenv func(string) string) error {
	var errs []error
	for _, k := range cfg.Connectors {
		if k.Type == ConnectorWebhook {
			if _, err := cfg.ConnectorSecret(k.ID); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		for _, key := range k.Credentials() {
			if _, err := k.Credential(key, getenv); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}
