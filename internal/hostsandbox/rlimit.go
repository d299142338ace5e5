package hostsandbox

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/agentproto"
)

// rlimitResources are the limits a request may set (agentproto.Request.Rlimits).
var rlimitResources = map[string]int{
	"core":  unix.RLIMIT_CORE,
	"cpu":   unix.RLIMIT_CPU,
	"data":  unix.RLIMIT_DATA,
	"nproc": unix.RLIMIT_NPROC,
}

// ApplyRlimits is what an agent does with agentproto.Request.Rlimits: it lowers its
// own limits, soft and hard, before anything of the run happens. A process
// may always lower its own, with no capability; the scheduler setting them
// with prlimit(2) would need CAP_SYS_RESOURCE (which container hosts often
// do not grant), and starting each agent through prlimit(1) cost a process
// start per run. An unknown name or a refused limit is an error: the agent
// then exits with agentproto.ExitConfinement. It lives here, not in the
// protocol package, so that agentproto stays a contract without syscalls.
func ApplyRlimits(rs []agentproto.Rlimit) error {
	for _, rl := range rs {
		res, ok := rlimitResources[rl.Name]
		if !ok {
			return fmt.Errorf("cannot set rlimit %q: unknown", rl.Name)
		}
		lim := unix.Rlimit{Cur: rl.Value, Max: rl.Value}
		if err := unix.Setrlimit(res, &lim); err != nil {
			return fmt.Errorf("cannot set RLIMIT_%s to %d: %w", rl.Name, rl.Value, err)
		}
	}
	return nil
}
