package provider

import (
	"context"
	"testing"

	"github.com/berth-dev/berth/internal/agentproto"
)

// Behind the egress proxy a provider has no key: the proxy adds it, and
// drops whatever the sandbox sent. The clients must call without one.
func TestAProviderBehindTheEgressProxySendsNoKeyOfItsOwn(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		cfg       func(f *fakeAPI) agentproto.Provider
		reply     reply
		path      string
		tokensKey string // the body's max tokens field
	}{
		{
			name: "OpenAI_itself_through_the_proxy_gets_max_completion_tokens",
			cfg: func(f *fakeAPI) agentproto.Provider {
				return agentproto.Provider{Name: "oa", Kind: "openai", BaseURL: f.srv.URL + "/providers/oa", Proxied: true, Model: "gpt-test", MaxTokens: 100}
			},
			reply: oaText("hi"), path: "/providers/oa/chat/completions", tokensKey: "max_completion_tokens",
		},
		{
			name: "An_OpenAI_compatible_server_through_the_proxy_gets_max_tokens",
			cfg: func(f *fakeAPI) agentproto.Provider {
				return agentproto.Provider{Name: "oa", Kind: "openai", BaseURL: f.srv.URL + "/providers/oa", Proxied: true, Endpoint: "http://ollama.lan:11434/v1", Model: "gpt-test", MaxTokens: 100}
			},
			reply: oaText("hi"), path: "/providers/oa/chat/completions", tokensKey: "max_tokens",
		},
		{
			name: "Anthropic_through_the_proxy_calls_the_messages_API",
			cfg: func(f *fakeAPI) agentproto.Provider {
				return agentproto.Provider{Name: "an", Kind: "anthropic", BaseURL: f.srv.URL + "/providers/an", Proxied: true, Model: "claude-test", MaxTokens: 100}
			},
			reply: anText("hi"), path: "/providers/an/v1/messages", tokensKey: "max_tokens",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeAPI(t, tt.reply)
			p, err := New(tt.cfg(f))
			if err != nil {
				t.Fatal(err)
			}
			turn, _, err := p.Complete(context.Background(), Conversation{Messages: []Message{{Role: RoleUser, Text: "hello"}}}, nil)
			if err != nil || turn.Text != "hi" {
				t.Fatalf("Complete = %+v, %v; want the reply", turn, err)
			}
			if f.paths[0] != tt.path {
				t.Errorf("path = %s, want %s", f.paths[0], tt.path)
			}
			for _, h := range []string{"Authorization", "X-Api-Key"} {
				if v, ok := f.headers[0][h]; ok {
					t.Errorf("the client sent %s %q; behind the proxy it must send none", h, v)
				}
			}
			if body := f.body(0); body[tt.tokensKey] != float64(100) {
				t.Errorf("body = %v, want %s 100", body, tt.tokensKey)
			}
		})
	}
}
