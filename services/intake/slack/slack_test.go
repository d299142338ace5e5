package slack

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-dev/berth/services/intake/connector"
	"github.com/berth-dev/berth/services/intake/slack/slacktest"
)

func TestNewRejectsBadOptionsWithAClearErrorAndNoSecret(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "ca.txt")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	good := func() Options {
		return Options{AppToken: "xapp-1-secret-app", BotToken: "xoxb-secret-bot", SigningSecret: "secret-signing"}
	}
	tests := []struct {
		name string
		edit func(*Options)
		want string
	}{
		{"A_missing_bot_token", func(o *Options) { o.BotToken = "" }, "bot_token is missing"},
		{"A_user_token_as_bot_token", func(o *Options) { o.BotToken = "xoxp-secret-user" }, "bot_token is not a bot token"},
		{"Socket_mode_without_app_token", func(o *Options) { o.AppToken = "" }, "app_token is missing"},
		{"A_bot_token_as_app_token", func(o *Options) { o.AppToken = "xoxb-secret-bot" }, "app_token is not an app-level token"},
		{"Events_mode_without_signing_secret", func(o *Options) { o.Mode, o.SigningSecret = ModeEvents, "" }, "signing_secret is missing"},
		{"An_unknown_mode", func(o *Options) { o.Mode = "rtm" }, `mode "rtm"`},
		{"An_unknown_trigger", func(o *Options) { o.Trigger = "always" }, `trigger "always"`},
		{"A_base_url_that_is_not_http", func(o *Options) { o.BaseURL = "ftp://example.invalid/" }, "base_url"},
		{"A_missing_ca_file", func(o *Options) { o.CAFile = filepath.Join(dir, "absent.pem") }, "cannot read ca_file"},
		{"A_ca_file_without_certificates", func(o *Options) { o.CAFile = notPEM }, "holds no PEM certificate"},
		{"Back_off_bounds_the_wrong_way_round", func(o *Options) { o.BackoffMin, o.BackoffMax = 2e9, 1e9 }, "back-off"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			o := good()
			tc.edit(&o)
			_, err := New("slack-main", o)
			if err == nil {
				t.Fatalf("New succeeded, want an error mentioning %q", tc.want)
			}
			msg := err.Error()
			if !strings.Contains(msg, tc.want) || !strings.Contains(msg, "slack-main") {
				t.Errorf("error %q does not name the connector and %q", msg, tc.want)
			}
			for _, secret := range []string{"secret-app", "secret-bot", "secret-signing", "secret-user"} {
				if strings.Contains(msg, secret) {
					t.Errorf("error %q holds a credential", msg)
				}
			}
		})
	}
	if _, err := New("", good()); err == nil {
		t.Errorf("New accepted an empty id")
	}
}

func TestSocketModeIsLongLived(t *testing.T) {
	t.Parallel()
	fake := slacktest.New(t, slacktest.Options{})
	c, _ := newSender(t, fake, nil)
	if !c.LongLived() {
		t.Errorf("a socket-mode connector must keep intake up")
	}
}

func TestTLSWithTheFakesCertificateInCAFileConnectsAndPosts(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	fake := slacktest.New(t, slacktest.Options{TLS: true})
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, fake.CertPEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	sink := newSink()
	c, _ := startSocket(t, fake, sink, func(o *Options) { o.CAFile = ca })
	ev := mention(fake, "over TLS")
	if _, err := fake.Deliver(ctx, ev); err != nil {
		t.Fatal(err)
	}
	sink.wait(ctx, t, 1)
	if err := c.Send(ctx, connector.Reply{RunID: "r", MessageID: "m", Channel: "C0CHAN", Thread: ev.TS, Text: "done"}); err != nil {
		t.Fatalf("Send over TLS: %v", err)
	}
}

func TestTLSWithoutTheFakesCertificateIsRefused(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	fake := slacktest.New(t, slacktest.Options{TLS: true})
	c, _ := newSender(t, fake, nil)
	err := c.Send(ctx, connector.Reply{RunID: "r", MessageID: "m", Channel: "C0CHAN", Text: "done"})
	if err == nil || connector.IsPermanent(err) {
		t.Errorf("Send to an untrusted certificate = %v, want a transient error", err)
	}
}

func TestCredentialsNeverReachTheLogOrStatus(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	fake := slacktest.New(t, slacktest.Options{AppToken: "xapp-1-A0APP-1234-supersecretapp", BotToken: "xoxb-1234-supersecretbot"})
	sink := newSink()
	c, logs := startSocket(t, fake, sink, nil)

	ev := mention(fake, "hello")
	if _, err := fake.Deliver(ctx, ev); err != nil {
		t.Fatal(err)
	}
	sink.wait(ctx, t, 1)
	if err := fake.SendRaw(ctx, []byte("garbage")); err != nil {
		t.Fatal(err)
	}
	fake.Drop()
	if err := fake.WaitConnections(ctx, 2); err != nil {
		t.Fatal(err)
	}
	fake.Refuse("C0GONE", "channel_not_found")
	sendErr := c.Send(ctx, connector.Reply{RunID: "r", MessageID: "m", Channel: "C0GONE", Text: "x"})
	if err := c.Send(ctx, connector.Reply{RunID: "r", MessageID: "m2", Channel: "C0CHAN", Thread: ev.TS, Text: "ok"}); err != nil {
		t.Fatal(err)
	}
	st := c.Status()
	everything := strings.Join([]string{logs.String(), fmt.Sprintf("%+v", st), fmt.Sprint(sendErr)}, "\n")
	for _, secret := range []string{"supersecretapp", "supersecretbot"} {
		if strings.Contains(everything, secret) {
			t.Errorf("credential %q appears in the log, Status or an error:\n%s", secret, everything)
		}
	}
	if !strings.Contains(logs.String(), "level=DEBUG") {
		t.Errorf("the log was not captured at debug level; the test proves nothing")
	}
}

func TestAGivenTLSConfigIsUsedForTheWebAPIAndTheSocket(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	fake := slacktest.New(t, slacktest.Options{TLS: true})
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(fake.CertPEM()) {
		t.Fatal("the fake's certificate does not parse")
	}
	sink := newSink()
	startSocket(t, fake, sink, func(o *Options) { o.TLSConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12} })
	if _, err := fake.Deliver(ctx, mention(fake, "hi")); err != nil {
		t.Fatal(err)
	}
	sink.wait(ctx, t, 1)
}

func TestBaseURLTakesTheHostAloneOrTheAPIRoot(t *testing.T) {
	t.Parallel()
	fake := slacktest.New(t, slacktest.Options{})
	host := strings.TrimSuffix(fake.APIURL(), "/api/")
	for _, base := range []string{host, host + "/", host + "/api", host + "/api/"} {
		t.Run(base, func(t *testing.T) {
			t.Parallel()
			c, _ := newSender(t, fake, func(o *Options) { o.BaseURL = base })
			r := connector.Reply{RunID: "run-" + base, MessageID: "C0CHAN:1.0001", Channel: "C0CHAN", Thread: "1.0001", Text: "via " + base}
			if err := c.Send(testContext(t), r); err != nil {
				t.Fatalf("Send with base_url %q: %v", base, err)
			}
		})
	}
}
