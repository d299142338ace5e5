// Command berth-imaged owns berth's container images and images.db: it
// builds an agent's container image from its image_config and the isolation
// image its container runs use, through the Docker Engine API, and serves
// dev.berth.Images1. It is D-Bus-activated (Type=dbus) and exits when idle.
package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/daemon"
	"github.com/berth-dev/berth/internal/tracing"
	"github.com/berth-dev/berth/services/images"
)

func main() {
	configFlag := flag.String("config", "", "config file (default $BERTH_CONFIG or /etc/berth/berth.toml)")
	stateFlag := flag.String("state-dir", "", "state directory (default $STATE_DIRECTORY, $BERTH_STATE_DIR/images or /var/lib/berth/images)")
	idleFlag := flag.Duration("idle-exit", idleDefault(), "exit with status 75 after this long with no build and no call (0: never; default $BERTH_IMAGED_IDLE_EXIT, else 0)")
	flag.Parse()
	// Traces are flushed once the daemon has stopped (an idle exit too);
	// [tracing] off: nothing to flush.
	flush := func() {}
	code := daemon.Main(daemon.Spec[*images.Service]{
		Name: "berth-imaged", StateName: "images", Status: "serving images",
		ConfigFlag: *configFlag, StateFlag: *stateFlag,
		New: func(env daemon.Env) (*images.Service, error) {
			var err error
			if flush, err = tracing.Setup(env.Config.Tracing, "berth-imaged", env.Log); err != nil {
				return nil, fmt.Errorf("cannot set up tracing: %w", err)
			}
			return images.New(env.Config, env.StateDir, images.Options{Logger: env.Log, Authorizer: bus.Authorizer{}})
		},
		IdleAfter: *idleFlag,
		Busy:      (*images.Service).Busy,
	})
	flush()
	os.Exit(code)
}

// idleDefault lets an activation that passes no flags (D-Bus activation
// without systemd, as on the test bus) set the idle timeout.
func idleDefault() time.Duration {
	d, _ := time.ParseDuration(os.Getenv("BERTH_IMAGED_IDLE_EXIT"))
	return d
}
