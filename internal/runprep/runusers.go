package runprep

import (
	"slices"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/filestamp"
	"github.com/berth-dev/berth/isolation"
)

// Every run's host facts need [scheduler] egress_user (and, with
// agent_uids = "off", run_as) looked up; where os/user reads /etc/passwd and
// /etc/group itself (berth is built without cgo), that is two files parsed
// per run. A userCache keeps the answers, errors included, while both files
// are the files they were (same inode, size, mtime and ctime), and for at
// most userCacheMaxAge: a user the admin adds, removes or renumbers is seen
// at the next run. A build that resolves users through NSS (cgo) has
// sources no stat can watch, and looks them up every time.

// userCacheMaxAge bounds how long an answer is kept even when the files
// look unchanged (an edit in place within one timestamp tick).
const userCacheMaxAge = 30 * time.Second

// userDatabases are the files os/user reads without cgo.
var userDatabases = []string{"/etc/passwd", "/etc/group"}

type userCache struct {
	lookup func(string) (*isolation.RunUser, error)
	files  []string
	now    func() time.Time
	// enabled is false where lookups do not come from files alone.
	enabled bool

	mu      sync.Mutex
	stamp   []filestamp.Stamp // of files; a missing file's is the zero Stamp
	since   time.Time
	answers map[string]userAnswer
}

type userAnswer struct {
	user *isolation.RunUser
	err  error
}

var runUsers = &userCache{lookup: isolation.LookupRunUser, files: userDatabases, now: time.Now, enabled: usersFromFilesOnly}

// Lookup is isolation.LookupRunUser, answered from the cache while the
// user databases are unchanged. The caller gets a copy of its own.
func (c *userCache) Lookup(name string) (*isolation.RunUser, error) {
	if !c.enabled {
		return c.lookup(name)
	}
	// Stat before the lookup: a change made meanwhile shows at the next call.
	stamp := c.stampFiles()
	now := c.now()
	c.mu.Lock()
	if !slices.Equal(stamp, c.stamp) || now.Sub(c.since) >= userCacheMaxAge || now.Before(c.since) {
		c.stamp, c.since, c.answers = stamp, now, map[string]userAnswer{}
	}
	a, ok := c.answers[name]
	c.mu.Unlock()
	if !ok {
		a.user, a.err = c.lookup(name)
		c.mu.Lock()
		if slices.Equal(stamp, c.stamp) {
			c.answers[name] = a
		}
		c.mu.Unlock()
	}
	if a.user == nil {
		return nil, a.err
	}
	u := *a.user
	u.Groups = slices.Clone(u.Groups)
	return &u, a.err
}

func (c *userCache) stampFiles() []filestamp.Stamp {
	out := make([]filestamp.Stamp, len(c.files))
	for i, f := range c.files {
		out[i], _ = filestamp.Of(f) // a missing file: the zero Stamp
	}
	return out
}
