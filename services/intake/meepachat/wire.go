package meepachat

import (
	"encoding/json"
	"fmt"
)

// frame is one gateway frame, either direction.
type frame struct {
	Type string          `json:"type"`
	Data json.RawMessage `json:"data,omitempty"`
}

type botUser struct {
	ID       string `json:"id"`
	Username string `json:"username"`
	Bot      bool   `json:"bot"`
}

type wireChannel struct {
	ID       string  `json:"id"`
	ServerID *string `json:"serverId"`
	Name     string  `json:"name"`
	IsDM     bool    `json:"isDm"`
}

type wireServer struct {
	ID       string        `json:"id"`
	Name     string        `json:"name"`
	Channels []wireChannel `json:"channels"`
}

type readyData struct {
	User       *botUser      `json:"user"`
	Servers    []wireServer  `json:"servers"`
	DMChannels []wireChannel `json:"dmChannels"`
}

type wireMessage struct {
	ID        string   `json:"id"`
	ChannelID string   `json:"channelId"`
	UserID    string   `json:"userId"`
	ThreadID  string   `json:"threadId"`
	Content   string   `json:"content"`
	User      *botUser `json:"user"`
	Mentions  []struct {
		ID string `json:"id"`
	} `json:"mentions"`
	// Attachments are its files (attachments.go).
	Attachments []wireAttachment `json:"attachments"`
}

type subscribeData struct {
	ChannelIDs []string `json:"channelIds"`
}

type typingData struct {
	ChannelID string `json:"channelId"`
}

// encodeFrame marshals a frame and refuses one the gateway would not read.
func encodeFrame(typ string, data any) ([]byte, error) {
	f := map[string]any{"type": typ}
	if data != nil {
		f["data"] = data
	}
	b, err := json.Marshal(f)
	if err != nil {
		return nil, fmt.Errorf("cannot encode %s frame: %w", typ, err)
	}
	if len(b) > maxSendFrame {
		return nil, fmt.Errorf("a %s frame of %d bytes exceeds the gateway's %d-byte limit", typ, len(b), maxSendFrame)
	}
	return b, nil
}

// subscribeFrames packs channel ids into as few subscribe frames as fit in
// the gateway's frame limit. An id that cannot fit even alone is returned in
// skipped.
func subscribeFrames(ids []string) (frames [][]byte, skipped []string) {
	var cur []string
	flush := func() {
		if len(cur) == 0 {
			return
		}
		b, err := encodeFrame("subscribe", subscribeData{ChannelIDs: cur})
		if err == nil {
			frames = append(frames, b)
		}
		cur = nil
	}
	for _, id := range ids {
		if b, _ := json.Marshal(subscribeData{ChannelIDs: append(cur, id)}); len(b)+len(`{"data":,"type":"subscribe"}`) <= maxSendFrame {
			cur = append(cur, id)
			continue
		}
		flush()
		if b, _ := json.Marshal(subscribeData{ChannelIDs: []string{id}}); len(b)+len(`{"data":,"type":"subscribe"}`) > maxSendFrame {
			skipped = append(skipped, id)
			continue
		}
		cur = []string{id}
	}
	flush()
	return frames, skipped
}
