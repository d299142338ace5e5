package runprep

import (
	"encoding/binary"
	"fmt"
	"os/user"
	"strconv"

	bolt "go.etcd.io/bbolt"

	"github.com/berth-dev/berth/internal/config"
)

// Each agent runs as a uid of its own, allocated from [scheduler] agent_uids
// the first time the agent is run or explained, and kept in agent_uids/ (of
// Options.UIDs) for good (docs/adr/0014-per-agent-uids.md): a uid is never
// given to another agent, not even after its agent was removed, because
// that agent's workspace (and whatever else it left) is still owned by it.

// bucketAgentUIDs is agent_uids/; no migration creates it: an older file
// simply has no allocation yet.
var bucketAgentUIDs = []byte("agent_uids")

// uidTaken says whether the host's user or group database already names
// id: such an id belongs to someone else and is never allocated.
var uidTaken = func(id uint32) bool {
	s := strconv.FormatUint(uint64(id), 10)
	if _, err := user.LookupId(s); err == nil {
		return true
	}
	_, err := user.LookupGroupId(s)
	return err == nil
}

// storedAgentUID is the uid agent_uids/ holds for agent; ok is false when
// it holds none (or the bucket does not exist yet).
func storedAgentUID(tx *bolt.Tx, agent string) (uid uint32, ok bool) {
	b := tx.Bucket(bucketAgentUIDs)
	if b == nil {
		return 0, false
	}
	v := b.Get([]byte(agent))
	if len(v) != 4 {
		return 0, false
	}
	return binary.BigEndian.Uint32(v), true
}

// agentUID is agent's own uid: the one agent_uids/ holds when it lies in
// the range r, else the lowest id of r that no agent (configured or
// removed) holds and the host's user and group databases do not name,
// which is then recorded. An exhausted range fails the run with an error
// naming agent_uids, and so does a range agent_uids could not hold: the
// zero range of a Config made without config.Defaults would hand out uid
// 0, root.
func (p *Preparer) agentUID(agent string, r config.UIDRange) (uint32, error) {
	if p.opts.UIDs == nil {
		return 0, fmt.Errorf("cannot allocate a uid for agent %s: this scheduler keeps no uids", agent)
	}
	switch _, err := config.ParseUIDRange(r.String()); {
	case r == (config.UIDRange{}):
		return 0, fmt.Errorf("cannot allocate a uid for agent %s: [scheduler] agent_uids is empty (a Config made without config.Defaults)", agent)
	case r.Off:
		return 0, fmt.Errorf("cannot allocate a uid for agent %s: [scheduler] agent_uids is \"off\"", agent)
	case err != nil:
		return 0, fmt.Errorf("cannot allocate a uid for agent %s from [scheduler] agent_uids: %w", agent, err)
	}
	var uid uint32
	var found bool
	if err := p.opts.UIDs.View(func(tx *bolt.Tx) error {
		uid, found = storedAgentUID(tx, agent)
		return nil
	}); err != nil {
		return 0, fmt.Errorf("cannot read the uid of agent %s: %w", agent, err)
	}
	if found && inRange(uid, r) {
		return uid, nil
	}
	var previous uint32
	var moved bool
	err := p.opts.UIDs.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(bucketAgentUIDs)
		if err != nil {
			return err
		}
		// A run of the agent that started at the same time may have
		// allocated it meanwhile.
		if got, ok := storedAgentUID(tx, agent); ok {
			if inRange(got, r) {
				uid = got
				return nil
			}
			previous, moved = got, true
		}
		held := map[uint32]bool{}
		if err := b.ForEach(func(k, v []byte) error {
			if len(v) == 4 {
				held[binary.BigEndian.Uint32(v)] = true
			}
			return nil
		}); err != nil {
			return err
		}
		for id := uint64(r.First); id <= uint64(r.Last); id++ {
			if held[uint32(id)] || uidTaken(uint32(id)) {
				continue
			}
			uid = uint32(id)
			return b.Put([]byte(agent), binary.BigEndian.AppendUint32(nil, uid))
		}
		return errRangeExhausted{agent: agent, r: r, held: len(held)}
	})
	if ex, ok := err.(errRangeExhausted); ok {
		return 0, ex
	}
	if err != nil {
		return 0, fmt.Errorf("cannot allocate a uid for agent %s from [scheduler] agent_uids: %w", agent, err)
	}
	if moved && previous != uid {
		p.log.Warn("agent's uid is outside [scheduler] agent_uids: it gets a new one, and its workspace is handed to it",
			"agent", agent, "old_uid", previous, "uid", uid, "agent_uids", r.String())
	} else {
		p.log.Info("agent has its own uid now", "agent", agent, "uid", uid, "agent_uids", r.String())
	}
	return uid, nil
}

type errRangeExhausted struct {
	agent string
	r     config.UIDRange
	held  int
}

func (e errRangeExhausted) Error() string {
	return fmt.Sprintf("no free uid for agent %s in [scheduler] agent_uids %s: %d are held by berth's agents (removed agents keep theirs) and the rest are named by the host's user or group database; widen agent_uids",
		e.agent, e.r, e.held)
}

func inRange(uid uint32, r config.UIDRange) bool { return uid >= r.First && uid <= r.Last }
