package discord

import (
	"context"
	"crypto/ed25519"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/bwmarrin/discordgo"

	"github.com/berth-dev/berth/services/intake/connector"
)

const maxInteractionBytes = 1 << 20

// Handler serves Discord's Interactions endpoint (intake mounts it at
// /hooks/{connector id}; the admin enters that URL as the application's
// Interactions Endpoint URL).
func (c *Connector) Handler(sink connector.Sink) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.serveInteraction(w, r, sink)
	})
}

func (c *Connector) serveInteraction(w http.ResponseWriter, r *http.Request, sink connector.Sink) {
	if c.publicKey == nil {
		http.Error(w, "interactions are not configured for this connector (no public_key)", http.StatusNotFound)
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "POST only", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxInteractionBytes+1))
	if err != nil {
		http.Error(w, "cannot read the body", http.StatusBadRequest)
		return
	}
	if len(body) > maxInteractionBytes {
		c.log.Warn("discord interaction refused: body too large", "bytes", len(body))
		http.Error(w, "body too large", http.StatusRequestEntityTooLarge)
		return
	}
	if why := c.verify(r.Header, body); why != "" {
		// Discord sends invalid signatures on purpose to test the endpoint.
		c.log.Warn("discord interaction refused: "+why, "remote", r.RemoteAddr)
		http.Error(w, "invalid request signature", http.StatusUnauthorized)
		return
	}
	var head struct {
		Type discordgo.InteractionType `json:"type"`
	}
	if err := json.Unmarshal(body, &head); err != nil {
		c.log.Warn("discord interaction refused: malformed JSON", "error", err)
		http.Error(w, "malformed interaction", http.StatusBadRequest)
		return
	}
	if head.Type == discordgo.InteractionMessageComponent {
		c.noteEvent()
		c.componentOverHTTP(w, r.Context(), sink, body)
		return
	}
	var in discordgo.Interaction
	if err := json.Unmarshal(body, &in); err != nil {
		c.log.Warn("discord interaction refused: malformed JSON", "error", err)
		http.Error(w, "malformed interaction", http.StatusBadRequest)
		return
	}
	c.noteEvent()
	switch in.Type {
	case discordgo.InteractionPing:
		writeJSON(w, discordgo.InteractionResponse{Type: discordgo.InteractionResponsePong})
	case discordgo.InteractionApplicationCommand:
		c.command(w, r.Context(), sink, &in, body)
	default:
		c.log.Warn("discord interaction type not handled; refused", "type", int(in.Type), "message_id", in.ID)
		http.Error(w, "unsupported interaction type", http.StatusBadRequest)
	}
}

// verify checks X-Signature-Ed25519 over X-Signature-Timestamp + body; ""
// when it holds, else why not.
func (c *Connector) verify(h http.Header, body []byte) string {
	sigHex, ts := h.Get("X-Signature-Ed25519"), h.Get("X-Signature-Timestamp")
	if sigHex == "" || ts == "" {
		return "signature headers missing"
	}
	sig, err := hex.DecodeString(sigHex)
	if err != nil || len(sig) != ed25519.SignatureSize {
		return "signature is not 64 hex-encoded bytes"
	}
	msg := make([]byte, 0, len(ts)+len(body))
	msg = append(append(msg, ts...), body...)
	if !ed25519.Verify(c.publicKey, msg, sig) {
		return "signature does not verify"
	}
	return ""
}

func (c *Connector) command(w http.ResponseWriter, ctx context.Context, sink connector.Sink, in *discordgo.Interaction, body []byte) {
	if c.o.ApplicationID != "" && in.AppID != c.o.ApplicationID {
		c.log.Warn("discord interaction for another application refused", "message_id", in.ID)
		http.Error(w, "wrong application", http.StatusBadRequest)
		return
	}
	if in.ID == "" || in.Token == "" || in.AppID == "" {
		c.log.Warn("discord interaction without id, token or application id; refused")
		http.Error(w, "malformed interaction", http.StatusBadRequest)
		return
	}
	if in.GuildID != "" && len(c.guilds) > 0 && !c.guilds[in.GuildID] {
		c.log.Info("discord slash command from a guild not in guild_ids; answered and ignored", "message_id", in.ID)
		writeJSON(w, discordgo.InteractionResponse{
			Type: discordgo.InteractionResponseChannelMessageWithSource,
			Data: &discordgo.InteractionResponseData{Content: "This bot does not answer in this server.", Flags: discordgo.MessageFlagsEphemeral},
		})
		return
	}
	data, _ := in.Data.(discordgo.ApplicationCommandInteractionData)
	// The interaction's channel object tells threads apart (interactions/receiving-and-responding.mdx).
	var extra struct {
		Channel *discordgo.Channel `json:"channel"`
	}
	_ = json.Unmarshal(body, &extra)
	user := in.User
	if in.Member != nil && in.Member.User != nil {
		user = in.Member.User
	}
	msg := connector.Message{
		Connector: c.id,
		ID:        in.ID,
		Channel:   in.ChannelID,
		Server:    in.GuildID,
		Text:      commandText(data),
		Meta: map[string]string{
			MetaInteractionToken: in.Token,
			MetaApplicationID:    in.AppID,
			MetaReplyChannel:     in.ChannelID,
		},
	}
	if user != nil {
		msg.Author = user.Username
		msg.AuthorID = personID(user, "")
		msg.Meta[MetaAuthorID] = user.ID
	}
	if in.GuildID == "" {
		msg.Meta[MetaDM] = "true"
	}
	if ch := extra.Channel; ch != nil {
		msg.ChannelName = ch.Name
		if ch.IsThread() && ch.ParentID != "" {
			msg.Thread, msg.Channel = in.ChannelID, ch.ParentID
			if parent, ok := c.channel(ch.ParentID); ok {
				msg.ChannelName = parent.name
			}
		}
	}
	actx, cancel := context.WithTimeout(ctx, interactionAcceptTimeout)
	defer cancel()
	if err := sink.Accept(actx, msg); err != nil {
		c.log.Warn("cannot hand the slash command to intake; answering 500", "message_id", in.ID, "error", err)
		c.status.Failed(fmt.Errorf("cannot store slash command %s: %w", in.ID, err))
		http.Error(w, "cannot store the command", http.StatusInternalServerError)
		return
	}
	c.status.Healthy()
	c.log.Debug("discord slash command accepted", "message_id", in.ID, "command", data.Name)
	writeJSON(w, discordgo.InteractionResponse{Type: discordgo.InteractionResponseDeferredChannelMessageWithSource})
}

// componentOverHTTP answers a button's click (click) in the response body,
// within Discord's three seconds.
func (c *Connector) componentOverHTTP(w http.ResponseWriter, ctx context.Context, sink connector.Sink, body []byte) {
	var in componentInteraction
	if err := json.Unmarshal(body, &in); err != nil {
		c.log.Warn("discord interaction refused: malformed JSON", "error", err)
		http.Error(w, "malformed interaction", http.StatusBadRequest)
		return
	}
	if c.o.ApplicationID != "" && in.AppID != c.o.ApplicationID {
		c.log.Warn("discord interaction for another application refused", "interaction_id", in.ID)
		http.Error(w, "wrong application", http.StatusBadRequest)
		return
	}
	if in.ID == "" || in.Token == "" || in.AppID == "" {
		c.log.Warn("discord interaction without id, token or application id; refused")
		http.Error(w, "malformed interaction", http.StatusBadRequest)
		return
	}
	writeJSON(w, c.click(ctx, sink, &in))
}

// commandText is the command's option values ("/ask question: why" → "why"),
// or "/name" when it has none.
func commandText(d discordgo.ApplicationCommandInteractionData) string {
	var parts []string
	var walk func(opts []*discordgo.ApplicationCommandInteractionDataOption)
	walk = func(opts []*discordgo.ApplicationCommandInteractionDataOption) {
		for _, o := range opts {
			if o == nil {
				continue
			}
			if o.Value != nil {
				parts = append(parts, fmt.Sprint(o.Value))
			}
			walk(o.Options)
		}
	}
	walk(d.Options)
	if len(parts) == 0 {
		return "/" + d.Name
	}
	return strings.Join(parts, " ")
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}
