// Command berth-scheduler owns scheduler.db and dev.berth.Scheduler1: it
// queues runs per agent, runs each in its isolation backend and delivers the
// results to intake. It is D-Bus-activated (Type=dbus).
package main

import (
	"flag"
	"fmt"
	"net"
	"os"

	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/daemon"
	"github.com/berth-dev/berth/internal/schedules"
	"github.com/berth-dev/berth/internal/tracing"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/container"
	"github.com/berth-dev/berth/isolation/hostrun"
	"github.com/berth-dev/berth/isolation/kube"
	"github.com/berth-dev/berth/isolation/landlock"
	"github.com/berth-dev/berth/isolation/unrestricted"
	"github.com/berth-dev/berth/services/scheduler"
)

func main() {
	configFlag := flag.String("config", "", "config file (default $BERTH_CONFIG or /etc/berth/berth.toml)")
	stateFlag := flag.String("state-dir", "", "state directory (default $STATE_DIRECTORY, $BERTH_STATE_DIR/scheduler or /var/lib/berth/scheduler)")
	unrestrictedFlag := flag.Bool("unrestricted", false, "run landlock agents UNRESTRICTED on the host (no sandbox at all)")
	flag.Parse()
	// Traces are flushed once the daemon has stopped and closed its
	// service ([tracing]; off: nothing to flush).
	flush := func() {}
	code := daemon.Main(daemon.Spec[*scheduler.Service]{
		Name: "berth-scheduler", StateName: "scheduler", Status: "scheduling runs",
		ConfigFlag: *configFlag, StateFlag: *stateFlag,
		New: func(env daemon.Env) (*scheduler.Service, error) {
			var err error
			if flush, err = tracing.Setup(env.Config.Tracing, "berth-scheduler", env.Log); err != nil {
				return nil, fmt.Errorf("cannot set up tracing: %w", err)
			}
			return scheduler.New(env.Config, env.StateDir, scheduler.Options{
				Backends:          backends(env, *unrestrictedFlag),
				ForceUnrestricted: *unrestrictedFlag,
				Deliverer:         scheduler.BusDeliverer{Conn: env.Bus},
				Images:            busapi.NewImages(env.Bus),
				ScheduleTimers:    scheduleTimers(env),
				Logger:            env.Log,
				// Crash tests only: hold a start where the test kills us.
				Hold: scheduler.HoldAtFiles(os.Getenv("BERTH_TEST_HOLD_DIR")),
			})
		},
		Progress: (*scheduler.Service).LastProgress,
	})
	flush()
	os.Exit(code)
}

// scheduleTimers keeps the schedules' time in systemd timers where systemd
// runs the host: they outlive the scheduler, start it when a job is due and
// catch up a firing missed while the machine was off. Elsewhere nil: the
// scheduler keeps the time itself.
func scheduleTimers(env daemon.Env) schedules.Timers {
	if !hostrun.SystemdAvailable() {
		return nil
	}
	return &schedules.SystemdTimers{Logger: env.Log}
}

// backends are the isolation backends this host offers. The engine is
// contacted per run, every call with a deadline: a Docker that is down or
// hung fails container runs with a reason, and landlock agents keep running.
func backends(env daemon.Env, allUnrestricted bool) map[string]isolation.Backend {
	log := env.Log
	if hostrun.SystemdAvailable() {
		log.Info("host runs start as transient systemd units (cgroup limits)")
	} else {
		log.Warn("systemd is not reachable (not PID 1, or not root): host runs get a cgroup of their own where one is writable, else fail closed unless [scheduler] allow_rlimit_fallback = true; see berthctl sandbox explain")
	}
	bs := map[string]isolation.Backend{
		landlock.Name:     landlock.New(),
		unrestricted.Name: unrestricted.New(log),
	}
	if cb, err := container.New(container.Options{Instance: env.StateDir, Logger: log,
		// The reply does not wait for the engine's ContainerRemove (34–50 ms
		// here); a stop drains what is being removed, and a crash leaves it
		// to the next start's orphan sweep.
		RemoveInBackground: true}); err != nil {
		log.Warn("container isolation is not available", "err", err)
	} else {
		bs[container.Name] = cb
	}
	if usesKubernetes(env.Config) {
		k := env.Config.Kubernetes
		host, _, _ := net.SplitHostPort(k.ProxyListen)
		hostID, err := kube.HostID(k.HostID) // ADR 28: no identity, no backend
		if err != nil {
			log.Warn("kubernetes isolation is not available", "err", err)
		} else if kb, err := kube.New(kube.Options{Kubeconfig: k.Kubeconfig, Instance: env.StateDir, HostID: hostID, Namespace: k.Namespaced(), ProxyHost: host, Logger: log}); err != nil {
			log.Warn("kubernetes isolation is not available", "err", err)
		} else {
			bs[kube.Name] = kb
		}
	}
	if allUnrestricted {
		// scheduler.Options.ForceUnrestricted compiles their plans so.
		log.Warn("--unrestricted: every landlock agent runs UNRESTRICTED on the host, with no sandbox")
	}
	return bs
}

// usesKubernetes says whether an agent runs on the kubernetes backend (a
// reload that adds the first one needs a restart to get the backend).
func usesKubernetes(cfg *config.Config) bool {
	for _, id := range cfg.AgentIDs() {
		if a, err := cfg.Agent(id); err == nil && a.Isolation == config.BackendKubernetes {
			return true
		}
	}
	return false
}
