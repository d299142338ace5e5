package images_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/metrics"
)

// A real build (Docker) is counted with its time, and the store's series
// are there, as berth-metrics reads them over the bus.
func TestImagesMetricsOverTheBusCountABuild(t *testing.T) {
	t.Parallel()
	cli := testdockerEngine(t)
	needBase(t, cli)
	cfg, _ := writeConfig(t, fmt.Sprintf("[[agents]]\nid = \"ops\"\n[agents.container_mode]\nenabled = true\n[agents.image_config]\nenabled = true\nenv_vars = { RUN_NONCE = %q }\n", nonce()))
	f := newService(t, cfg)
	b := f.onPrivateBus(t)
	tag := ensure(t, f, "ops")
	f.removeImagesAtEnd(t, tag)

	raw, err := busapi.NewMetrics(b.Conn(t), bus.ImagesName, bus.ImagesPath).Metrics(context.Background())
	if err != nil {
		t.Fatalf("Metrics over the bus: %v", err)
	}
	fams, err := metrics.Decode(raw)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []struct {
		name   string
		labels []string
		value  float64
	}{
		{"berth_images_builds_total", []string{"target", "ops", "outcome", "succeeded"}, 1},
		{"berth_images_build_duration_seconds", []string{"target", "ops"}, 1},
		{"berth_images_building", nil, 0},
	} {
		got, ok := metrics.Sample(fams, want.name, want.labels...)
		if !ok || got != want.value {
			t.Errorf("%s%v = %v (found %v), want %v", want.name, want.labels, got, ok, want.value)
		}
	}
	if v, _ := metrics.Sample(fams, "berth_images_images"); v < 1 {
		t.Errorf("berth_images_images = %v, want the image just built", v)
	}
	if v, _ := metrics.Sample(fams, "berth_bolt_file_size_bytes", "db", "images.db"); v <= 0 {
		t.Errorf("berth_bolt_file_size_bytes{db=images.db} = %v", v)
	}
}
