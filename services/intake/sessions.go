package intake

import (
	"bytes"
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// bucketSessions holds each gateway connector's session (sessions/<connector
// id>), so that a restarted intake resumes it and Discord replays what was
// sent while intake was down. It is created by the first save: no schema
// change, and an older intake simply ignores it.
var bucketSessions = []byte("sessions")

// GatewaySession returns the session the connector last kept (nil when it
// kept none). It implements discord.SessionStore.
func (s *Service) GatewaySession(connectorID string) ([]byte, error) {
	return s.store.gatewaySession(connectorID)
}

// SaveGatewaySession keeps a connector's session, fsynced, or forgets it
// when session is empty. It implements discord.SessionStore.
func (s *Service) SaveGatewaySession(connectorID string, session []byte) error {
	return s.store.saveGatewaySession(connectorID, session)
}

func (s *store) gatewaySession(connectorID string) ([]byte, error) {
	var out []byte
	err := s.db.View(func(tx *bolt.Tx) error {
		if b := tx.Bucket(bucketSessions); b != nil {
			out = bytes.Clone(b.Get([]byte(connectorID)))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("cannot read the gateway session of %s: %w", connectorID, err)
	}
	return out, nil
}

func (s *store) saveGatewaySession(connectorID string, session []byte) error {
	if connectorID == "" {
		return errors.New("cannot keep a gateway session: no connector id")
	}
	err := s.write(func(tx *bolt.Tx) error {
		if len(session) == 0 {
			if b := tx.Bucket(bucketSessions); b != nil {
				return b.Delete([]byte(connectorID))
			}
			return nil
		}
		b, err := tx.CreateBucketIfNotExists(bucketSessions)
		if err != nil {
			return err
		}
		return b.Put([]byte(connectorID), bytes.Clone(session))
	})
	if err != nil {
		return fmt.Errorf("cannot keep the gateway session of %s: %w", connectorID, err)
	}
	return nil
}
