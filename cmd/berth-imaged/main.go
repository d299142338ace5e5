// Command berth-imaged owns berth's container images and images.db: it
// builds an agent's container image from its image_config and the isolation
// image its container runs use, through the Docker Engine API, and serves
// dev.berth.Images1. It is D-Bus-activated (Type=dbus) and exits when idle.
package main

import (
	"flag"
	"os"
	"time"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/daemon"
	"github.com/berth-dev/berth/services/images"
)

func main() {
	configFlag := flag.String("config", "", "config file (default $BERTH_CONFIG or /etc/berth/berth.toml)")
	stateFlag := flag.String("state-dir", "", "state directory (default $STATE_DIRECTORY, $BERTH_STATE_DIR/images or /var/lib/berth/images)")
	idleFlag := flag.Duration("idle-exit", idleDefault(), "exit with status 75 after this long with no build and no call (0: never; default $BERTH_IMAGED_IDLE_EXIT, else 0)")
	flag.Parse()
	os.Exit(daemon.Main(daemon.Spec[*images.Service]{
		Name: "berth-imaged", StateName: "images", Status: "serving images",
		ConfigFlag: *configFlag, StateFlag: *stateFlag,
		New: func(env daemon.Env) (*images.Service, error) {
			return images.New(env.Config, env.StateDir, images.Options{Logger: env.Log, Authorizer: bus.Authorizer{}})
		},
		IdleAfter: *idleFlag,
		Busy:      (*images.Service).Busy,
	}))
}

// idleDefault lets an activation that passes no flags (D-Bus activation
// without systemd, as on the test bus) set the idle timeout.
func idleDefault() time.Duration {
	d, _ := time.ParseDuration(os.Getenv("BERTH_IMAGED_IDLE_EXIT"))
	return d
}
