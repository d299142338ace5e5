package main

import (
	"encoding/json"
	"flag"
	"io"
	"net/http"
)

// Usage the fake model reports for every answer: the egress proxy counts
// it into the run's usage record, and the scheduler into the provider
// series the metrics step queries.
const (
	modelInputTokens  = 12
	modelOutputTokens = 5
)

// model plays an OpenAI-compatible provider for the install test's metered
// agent: every chat completion answers with --answer and its usage.
func model(args []string) error {
	fs := flag.NewFlagSet("model", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:9998", "listen address")
	answer := fs.String("answer", "model-reply", "what every completion says")
	if err := fs.Parse(args); err != nil {
		return err
	}
	return http.ListenAndServe(*addr, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/v1/chat/completions" {
			http.NotFound(w, r)
			return
		}
		var req struct {
			Model string `json:"model"`
		}
		body, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(body, &req); err != nil {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{
			"id": "install-test", "object": "chat.completion", "created": 1, "model": req.Model,
			"choices": []any{map[string]any{"index": 0, "finish_reason": "stop",
				"message": map[string]any{"role": "assistant", "content": *answer}}},
			"usage": map[string]any{"prompt_tokens": modelInputTokens, "completion_tokens": modelOutputTokens,
				"total_tokens": modelInputTokens + modelOutputTokens},
		})
	}))
}
