package config

import (
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
)

// [image_config] and [agents.image_config] describe the container image the
// image service builds for an agent. What goes into an image is readable by
// everyone who can run it, so env_vars must never carry a secret: names that
// look like one and values taken from a provider's key are config errors.

var (
	// debianPackagePattern is Debian policy's package name: lowercase
	// letters, digits, '+', '-' and '.', at least two characters, starting
	// with a letter or digit.
	debianPackagePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]+$`)
	// imageRefPattern is a loose image reference: [host[:port]/]path[:tag][@digest].
	imageRefPattern = regexp.MustCompile(`^[a-z0-9]+([._-]+[a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-]+[a-z0-9]+)*)*(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[0-9a-f]{64})?$`)
)

// secretNameParts are words of an environment variable name that say its
// value is a secret (OPENAI_API_KEY, GITHUB_TOKEN, DB_PASSWORD, ...).
var secretNameParts = []string{"KEY", "APIKEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASS", "CREDENTIAL", "CREDENTIALS", "AUTH", "PRIVATE", "COOKIE", "SESSION"}

// secretValuePrefixes start well-known token formats.
var secretValuePrefixes = append([]string{"sk-", "ghp_", "github_pat_", "glpat-"}, slackTokenPrefixes...)

func debianPackage(s string) string {
	if !debianPackagePattern.MatchString(s) {
		return fmt.Sprintf("%q is not a Debian package name (lowercase letters, digits, '+', '-', '.', at least 2 characters)", s)
	}
	return ""
}

func imageRef(s string) string {
	if !imageRefPattern.MatchString(s) {
		return fmt.Sprintf("%q is not an image reference (name[:tag][@sha256:digest], like berth-base:bookworm)", s)
	}
	return ""
}

// secretLookingName tells whether an environment variable name says its
// value is a secret.
func secretLookingName(name string) bool {
	for part := range strings.FieldsFuncSeq(strings.ToUpper(name), func(r rune) bool { return r == '_' || r == '-' }) {
		if slices.Contains(secretNameParts, part) || strings.HasSuffix(part, "APIKEY") || strings.HasSuffix(part, "TOKEN") {
			return true
		}
	}
	return false
}

// imageValues checks the env_vars one file sets in an image_config: a name
// and its value together.
func (c *checks) imageValues(at fieldLocs, s *ImageSettings) {
	for _, name := range slices.Sorted(maps.Keys(s.EnvVars)) {
		l := at[envVarKey(name)]
		value := s.EnvVars[name]
		switch {
		case !envNamePattern.MatchString(name):
			c.fail(l, "%q is not an environment variable name", name)
		case secretLookingName(name):
			c.fail(l, "looks like a secret; an image's environment is readable by everything in it, so secrets never go there (the egress proxy adds provider keys on the way out)")
		case slices.ContainsFunc(secretValuePrefixes, func(p string) bool { return strings.HasPrefix(value, p) }):
			c.fail(l, "holds what looks like a token (its value is not shown); secrets never go into an image")
		}
	}
}

// imageMerged checks what only the merged configuration tells: env_vars
// values that name a provider's key variable.
func (t *tree) imageMerged(c *checks, at fieldLocs, s *ImageSettings) {
	keyEnvs := t.apiKeyEnvs()
	for _, name := range slices.Sorted(maps.Keys(s.EnvVars)) {
		v := strings.TrimSuffix(strings.TrimPrefix(strings.TrimPrefix(s.EnvVars[name], "$"), "{"), "}")
		if slices.Contains(keyEnvs, v) {
			c.fail(at[envVarKey(name)], "names %s, the API key of a provider; provider keys never go into an image", v)
		}
	}
}

func (t *tree) apiKeyEnvs() []string {
	var names []string
	for _, p := range t.v.Providers.Entries {
		if e := p.v.APIKeyEnv; e != "" {
			names = append(names, e)
		}
	}
	return names
}

// CheckImageEnv refuses an image_config whose env_vars hold the value of a
// provider's API key, read with getenv: the scheduler and the image service
// call it at start and on reload. The error names the agent (or
// "image_config") and the variable, never the value.
func CheckImageEnv(cfg *Config, getenv func(string) string) error {
	keys := map[string]string{} // key value → variable
	for _, name := range slices.Sorted(maps.Keys(cfg.Providers.Entries)) {
		if env := cfg.Providers.Entries[name].APIKeyEnv; env != "" {
			if v := getenv(env); v != "" {
				keys[v] = env
			}
		}
	}
	var errs []error
	check := func(where string, vars map[string]string) {
		for _, name := range slices.Sorted(maps.Keys(vars)) {
			if env, ok := keys[vars[name]]; ok {
				errs = append(errs, fmt.Errorf("%s.env_vars.%s: holds the value of %s, a provider's API key; provider keys never go into an image", where, name, env))
			}
		}
	}
	check("image_config", cfg.ImageConfig.EnvVars)
	for _, a := range cfg.Agents {
		check("agents."+joinKey("", a.ID)+".image_config", a.ImageConfig.EnvVars)
	}
	return errors.Join(errs...)
}

// DefaultImage is the global [image_config] resolved the way an agent
// without an image_config of its own gets it: what the image service builds
// for the "default" target.
func (c *Config) DefaultImage() ImageConfig {
	return c.image(&ImageSettings{})
}
