package scheduler

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/testkit/testdocker"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/container"
)

func TestEgressAContainerRunWithNetworkNoneCallsItsProviderWithoutTheKey(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	cli := testdocker.Engine(t)
	agentBin, proxyBin := egressBinaries(t)
	model := fakeModel(t)
	cfg := egressConfig(agentBin, proxyBin, model.URL)
	enabled := true
	cfg.Agents[0].ContainerMode = config.ContainerSettings{Enabled: &enabled, Network: "none"}
	stateDir := sharedStateDir(t)
	boxes, err := container.New(container.Options{Client: cli, Instance: stateDir, Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	addr := model.Listener.Addr().String()
	// The container is removed after the run; inspect it while it runs.
	inspected := make(chan string, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		for ctx.Err() == nil {
			list, err := cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: make(client.Filters).Add("label", container.LabelInstance+"="+container.InstanceLabel(stateDir))})
			if err == nil && len(list.Items) > 0 {
				info, err := cli.ContainerInspect(ctx, list.Items[0].ID, client.ContainerInspectOptions{})
				if err == nil {
					inspected <- string(info.Raw) + " network=" + string(info.Container.HostConfig.NetworkMode)
					return
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
		inspected <- ""
	}()
	res, rep := runEgress(t, cfg, stateDir, map[string]isolation.Backend{container.Name: boxes}, directTraffic(addr))
	checkEgressRun(t, res, rep, addr)
	if got := <-inspected; got == "" {
		t.Error("could not inspect the run's container while it ran")
	} else {
		if strings.Contains(got, egressTestKey) {
			t.Fatal("docker inspect shows the key")
		}
		if !strings.Contains(got, "network=none") || !strings.Contains(got, "/run/berth-egress") {
			t.Errorf("container: want network none and the run's socket mounted: %.300s", got)
		}
	}
}
