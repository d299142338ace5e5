// Command berth-intake accepts chat messages over HTTP (socket-activated by
// berth-intake.socket, or --listen), stores them in intake.db, hands them to
// the scheduler over D-Bus and delivers replies (dev.berth.Intake1.Deliver).
package main

import (
	"flag"
	"fmt"
	"net/http"
	"os"

	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/daemon"
	"github.com/berth-dev/berth/internal/tracing"
	"github.com/berth-dev/berth/services/intake"
)

func main() {
	configFlag := flag.String("config", "", "config file (default $BERTH_CONFIG or /etc/berth/berth.toml)")
	stateFlag := flag.String("state-dir", "", "state directory (default $STATE_DIRECTORY, $BERTH_STATE_DIR/intake or /var/lib/berth/intake)")
	listenFlag := flag.String("listen", "", "HTTP address when not socket-activated (default [intake] listen)")
	idleFlag := flag.Duration("idle-exit", 0, "exit with status 75 after this long with nothing to do, unless a long-lived connector is configured (0: never)")
	flag.Parse()
	// Traces are flushed once the daemon has stopped and closed its
	// service ([tracing]; off: nothing to flush).
	flush := func() {}
	code := daemon.Main(daemon.Spec[*intake.Service]{
		Name: "berth-intake", StateName: "intake", Status: "accepting messages",
		ConfigFlag: *configFlag, StateFlag: *stateFlag,
		New: func(env daemon.Env) (*intake.Service, error) {
			var err error
			if flush, err = tracing.Setup(env.Config.Tracing, "berth-intake", env.Log); err != nil {
				return nil, fmt.Errorf("cannot set up tracing: %w", err)
			}
			return intake.New(env.Config, env.StateDir, intake.WithLogger(env.Log))
		},
		Progress: (*intake.Service).LastProgress,
		HTTP:     func(s *intake.Service) http.Handler { return s.Handler() },
		Listen: func(cfg *config.Config) string {
			if *listenFlag != "" {
				return *listenFlag
			}
			return cfg.Intake.Listen
		},
		IdleAfter: *idleFlag,
		Busy:      hasWork,
	})
	flush()
	os.Exit(code)
}

// hasWork reports whether intake must keep running: messages or replies are
// pending, or a long-lived connector needs its connection.
func hasWork(svc *intake.Service) bool {
	if svc.HasLongLivedConnector() {
		return true
	}
	inbox, outbox, err := svc.Pending()
	return err != nil || inbox > 0 || outbox > 0
}
