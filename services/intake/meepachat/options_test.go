package meepachat

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-dev/berth/services/intake/connector"
)

func TestNewRefusesBadOptionsWithAClearError(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	ok := Options{BaseURL: "https://chat.example.com", Token: testToken}
	tests := []struct {
		name string
		edit func(*Options)
		want string
	}{
		{"No_base_url", func(o *Options) { o.BaseURL = "" }, "base_url is required"},
		{"A_base_url_that_is_not_http", func(o *Options) { o.BaseURL = "ftp://chat.example.com" }, "base_url must be"},
		{"A_base_url_without_a_host", func(o *Options) { o.BaseURL = "https://" }, "base_url must be"},
		{"A_base_url_with_credentials_is_not_echoed", func(o *Options) { o.BaseURL = "https://u:" + testSecret + "@chat.example.com" }, "with credentials"},
		{"A_gateway_url_of_another_scheme", func(o *Options) { o.GatewayURL = "tcp://chat.example.com/api/bot-gateway" }, "gateway_url must be"},
		{"No_token", func(o *Options) { o.Token = "" }, "token must be"},
		{"A_token_without_the_bot_id", func(o *Options) { o.Token = testSecret }, "token must be"},
		{"A_token_with_an_empty_secret", func(o *Options) { o.Token = testBotID + "." }, "token must be"},
		{"A_token_with_a_newline", func(o *Options) { o.Token = testToken + "\n" }, "token must be"},
		{"An_unknown_trigger", func(o *Options) { o.Trigger = "always" }, `trigger must be "mention" or "all"`},
		{"Back_off_bounds_inverted", func(o *Options) { o.BackoffMin, o.BackoffMax = 10, 5 }, "back-off bounds"},
		{"A_missing_ca_file", func(o *Options) { o.CAFile = filepath.Join(dir, "absent.pem") }, "cannot read ca_file"},
		{"A_ca_file_without_a_certificate", func(o *Options) { o.CAFile = notPEM }, "holds no PEM certificate"},
		{"A_client_and_tls_options_together", func(o *Options) { o.HTTPClient = http.DefaultClient; o.SkipTLSVerify = true }, "not both"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			o := ok
			tt.edit(&o)
			c, err := New("chat", o)
			if err == nil {
				t.Fatalf("New succeeded (%v), want an error saying %q", c, tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), `connector "chat"`) {
				t.Errorf("New = %q, want it to name the connector and say %q", err, tt.want)
			}
			if strings.Contains(err.Error(), testSecret) {
				t.Errorf("the error shows the secret: %q", err)
			}
		})
	}
}

func TestEndpointsFollowTheBaseOrTheGatewayURL(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, base, gateway  string
		wantBase, wantGateUR string
	}{
		{"A_base_url", "https://chat.example.com/", "", "https://chat.example.com", "https://chat.example.com/api/bot-gateway"},
		{"A_base_url_with_a_prefix", "http://10.0.0.5:8091/meepa", "", "http://10.0.0.5:8091/meepa", "http://10.0.0.5:8091/meepa/api/bot-gateway"},
		{"Only_MeepaGateways_gateway_url", "", "wss://chat.example.com/api/bot-gateway", "https://chat.example.com", "wss://chat.example.com/api/bot-gateway"},
		{"Both", "https://chat.example.com", "ws://127.0.0.1:8091/api/bot-gateway", "https://chat.example.com", "ws://127.0.0.1:8091/api/bot-gateway"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, err := New("chat", Options{BaseURL: tt.base, GatewayURL: tt.gateway, Token: testToken})
			if err != nil {
				t.Fatal(err)
			}
			if c.base != tt.wantBase || c.gateway != tt.wantGateUR {
				t.Errorf("base %q gateway %q, want %q and %q", c.base, c.gateway, tt.wantBase, tt.wantGateUR)
			}
			if !c.LongLived() || c.Status().Type != "meepachat" {
				t.Errorf("LongLived %v, status %+v", c.LongLived(), c.Status())
			}
		})
	}
}

func TestASelfHostedInstanceIsTrustedThroughItsCAFile(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		edit      func(o *Options, caFile string)
		wantTrust bool
	}{
		{"Without_the_CA_the_certificate_is_refused", func(*Options, string) {}, false},
		{"With_the_CA_file_it_connects_and_posts", func(o *Options, ca string) { o.CAFile = ca }, true},
		{"With_tls_verify_off_it_connects", func(o *Options, _ string) { o.SkipTLSVerify = true }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t)
			fo := testOptions()
			fo.TLS = true
			f := newFake(t, fo)
			ca, err := f.WriteCAFile(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			c, _ := newTestConnector(t, f, func(o *Options) { tt.edit(o, ca) })
			start(t, c, newSink())
			if !tt.wantTrust {
				st := waitStatus(ctx, t, c, "a certificate error", func(s connector.Status) bool { return s.LastError != "" })
				if !strings.Contains(st.LastError, "certificate") {
					t.Errorf("last error %q, want it to name the certificate", st.LastError)
				}
				if err := c.Send(ctx, reply("x")); err == nil || connector.IsPermanent(err) {
					t.Errorf("Send to an untrusted instance = %v, want a transient error", err)
				}
				return
			}
			waitStatus(ctx, t, c, "connected", func(s connector.Status) bool { return s.State == connector.StateConnected })
			if err := c.Send(ctx, reply("over TLS")); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestTheTokenNeverReachesLogsStatusOrErrors(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	f := newFake(t, testOptions())
	f.FailHandshakes(401)
	c, logs := newTestConnector(t, f, nil)
	sink := newSink()
	sink.fail = func(call int, m connector.Message) error {
		if call == 1 {
			return errDiskFull
		}
		return nil
	}
	connected(ctx, t, f, c, sink)
	deliver(ctx, t, f, human("m-1", "hello"))
	sink.wait(ctx, t, 1)
	var errs []string
	f.Refuse("ch-random", 403)
	f.RateLimit("600")
	for _, r := range []connector.Reply{reply("ok"), reply("limited"), {Channel: "ch-random", Text: "x", Meta: map[string]string{MetaServer: serverID}}} {
		if err := c.Send(ctx, r); err != nil {
			errs = append(errs, err.Error())
		}
	}
	other, _ := newTestConnector(t, f, func(o *Options) { o.Token = testBotID + ".other" + testSecret })
	if err := other.Send(ctx, reply("x")); err != nil {
		errs = append(errs, err.Error())
	}
	if len(errs) < 3 {
		t.Fatalf("errors %v, want the rate limit, the refusal and the bad token", errs)
	}
	everything := logs.String() + fmt.Sprintf("%+v %+v", c.Status(), other.Status()) + strings.Join(errs, "\n")
	if strings.Contains(everything, testSecret) || strings.Contains(everything, testToken) {
		t.Errorf("the bot token leaked:\n%s", everything)
	}
	for line := range strings.Lines(logs.String()) {
		if n := strings.Count(line, "connector=chat"); n != 1 {
			t.Errorf("a log line names the connector %d times, want once: %s", n, line)
		}
	}
}
