package provider

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// RetryPolicy is how often and how patiently one provider is retried after
// a transient error before the chain falls through to the next one.
type RetryPolicy struct {
	// Attempts is the number of calls per provider and model turn, including the first.
	Attempts int
	// Base is the delay before the first retry; each further retry doubles it.
	Base time.Duration
	// Max caps every delay. A server asking (Retry-After) for more than Max
	// is not retried: the chain moves on to the next provider at once.
	Max time.Duration
}

// DefaultRetry is the policy berth-agent uses: 3 calls, 1 s then 2 s
// apart, never waiting more than 30 s for one retry.
var DefaultRetry = RetryPolicy{Attempts: 3, Base: time.Second, Max: 30 * time.Second}

// delay is the wait before retry number n (1 for the first retry) after
// err, and whether to retry at all.
func (p RetryPolicy) delay(n int, err error) (time.Duration, bool) {
	if n >= p.Attempts {
		return 0, false
	}
	var pe *Error
	if errors.As(err, &pe) && pe.RetryAfter > 0 {
		return pe.RetryAfter, pe.RetryAfter <= p.Max
	}
	d := p.Base
	for i := 1; i < n && d < p.Max; i++ {
		d *= 2
	}
	return min(d, p.Max), true
}

// Named is one provider of a chain under its config name.
type Named struct {
	Name     string
	Provider Provider
}

// Chain calls its providers in order. Per model turn it tries the first
// one, retrying transient errors (connection errors, 408, 409, 429, 5xx)
// with capped exponential back-off that honours Retry-After; when they
// persist it falls through to the next provider. A context overflow
// compacts the conversation (see Compact) and retries the same provider
// once. Any other error (bad key, unknown model) ends the turn: it is a
// configuration problem that another provider would only hide.
type Chain struct {
	Providers []Named
	Retry     RetryPolicy
	Log       *slog.Logger
	// Sleep waits d or until ctx ends; nil means a timer. Tests replace it.
	Sleep func(ctx context.Context, d time.Duration) error
}

// Complete returns the next assistant turn for conv. It may compact conv
// in place; the caller keeps using the compacted conversation.
func (c *Chain) Complete(ctx context.Context, conv *Conversation, tools []Tool) (Turn, Usage, error) {
	if len(c.Providers) == 0 {
		return Turn{}, Usage{}, errors.New("no provider configured")
	}
	var failures []error
	for i, np := range c.Providers {
		turn, usage, err := c.completeWith(ctx, np, conv, tools)
		if err == nil {
			return turn, usage, nil
		}
		err = fmt.Errorf("provider %q: %w", np.Name, err)
		if ErrorClass(err) != Transient || ctx.Err() != nil {
			return Turn{}, Usage{}, err
		}
		failures = append(failures, err)
		if i+1 < len(c.Providers) {
			c.log().Warn("provider failed; falling back", "provider", np.Name, "next", c.Providers[i+1].Name, "err", err.Error())
		}
	}
	return Turn{}, Usage{}, fmt.Errorf("every provider failed: %w", errors.Join(failures...))
}

// completeWith calls one provider with retries and at most one compaction.
func (c *Chain) completeWith(ctx context.Context, np Named, conv *Conversation, tools []Tool) (Turn, Usage, error) {
	compacted := false
	for n := 1; ; {
		turn, usage, err := np.Provider.Complete(ctx, *conv, tools)
		if err == nil {
			return turn, usage, nil
		}
		switch ErrorClass(err) {
		case ContextOverflow:
			if compacted {
				return Turn{}, Usage{}, fmt.Errorf("context overflow even after compacting the history: %w", err)
			}
			compacted = true
			dropped, trimmed := Compact(conv)
			if dropped == 0 && trimmed == 0 {
				return Turn{}, Usage{}, fmt.Errorf("context overflow and nothing left to compact: %w", err)
			}
			c.log().Warn("context overflow: history compacted, retrying once", "provider", np.Name,
				"dropped_messages", dropped, "trimmed_tool_results", trimmed)
			continue
		case Transient:
			d, retry := c.retry().delay(n, err)
			if !retry {
				return Turn{}, Usage{}, err
			}
			c.log().Warn("provider call failed; retrying", "provider", np.Name, "attempt", n, "delay", d.String(), "err", err.Error())
			if err := c.sleep(ctx, d); err != nil {
				return Turn{}, Usage{}, err
			}
			n++
		default:
			return Turn{}, Usage{}, err
		}
	}
}

func (c *Chain) retry() RetryPolicy {
	if c.Retry.Attempts == 0 {
		return DefaultRetry
	}
	return c.Retry
}

func (c *Chain) log() *slog.Logger {
	if c.Log == nil {
		return slog.Default()
	}
	return c.Log
}

func (c *Chain) sleep(ctx context.Context, d time.Duration) error {
	if c.Sleep != nil {
		return c.Sleep(ctx, d)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
