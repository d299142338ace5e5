package images_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/testkit/otlpsink"
	"github.com/berth-dev/berth/internal/tracing"
)

// Not parallel: the tracer provider is the process's, and this test's
// receiver should get this test's spans only.
//
// A build asked for over the bus with the caller's traceparent is a branch
// of the caller's trace: the call's span is a child of the caller's span
// (its id, not just its trace), the build hangs under the call and its
// stages under the build. A Build job joins its caller's trace too, and a
// call that sends no traceparent starts a trace of its own.
func TestAnImageBuildIsASpanInTheCallersTrace(t *testing.T) {
	cli := testdockerEngine(t)
	needBase(t, cli)
	sink := otlpsink.Start(t)
	shutdown, err := tracing.Setup(config.Tracing{Endpoint: sink.HTTP}, "berth-imaged", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(shutdown)
	cfg, _ := writeConfig(t, fmt.Sprintf("[[agents]]\nid = \"traced\"\n[agents.container_mode]\nenabled = true\n[agents.image_config]\nenabled = true\nenv_vars = { RUN_NONCE = %q }\n", nonce()))
	f := newService(t, cfg)
	images := busapi.NewImages(f.onPrivateBus(t).Conn(t))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	const (
		buildTrace, buildParent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
		againTrace, againParent = "5cf92f3577b34da6a3ce929d0e0e4737", "11f067aa0ba902b8"
		jobTrace, jobParent     = "6df92f3577b34da6a3ce929d0e0e4738", "22f067aa0ba902b9"
	)
	traceparent := func(traceID, parent string) string { return "00-" + traceID + "-" + parent + "-01" }
	tag, err := images.EnsureIsolationImageWith(ctx, "traced", busapi.EnsureOptions{Traceparent: traceparent(buildTrace, buildParent)})
	if err != nil {
		t.Fatalf("EnsureIsolationImageWith: %v", err)
	}
	f.removeImagesAtEnd(t, tag)
	// The image is there now: asked again, nothing is built.
	if _, err := images.EnsureIsolationImageWith(ctx, "traced", busapi.EnsureOptions{Traceparent: traceparent(againTrace, againParent)}); err != nil {
		t.Fatalf("EnsureIsolationImageWith, the image present: %v", err)
	}
	job, err := images.Build(ctx, busapi.BuildTarget{Target: "traced", Traceparent: traceparent(jobTrace, jobParent)})
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	for p := range job.Follow(ctx) {
		if p.Finished && p.Error != "" || p.Lost != nil {
			t.Fatalf("the build job ended with %q (%v)", p.Error, p.Lost)
		}
	}
	// The control: the one-argument method sends no trace context.
	if _, err := images.EnsureIsolationImage(ctx, "traced"); err != nil {
		t.Fatalf("EnsureIsolationImage: %v", err)
	}

	ensureSpans := func(spans []otlpsink.Span) []otlpsink.Span {
		var out []otlpsink.Span
		for _, sp := range spans {
			if sp.Name == "images.ensure" {
				out = append(out, sp)
			}
		}
		return out
	}
	spans := sink.Wait(t, time.Minute, func(spans []otlpsink.Span) bool {
		jobEnded := false
		for _, sp := range spans {
			jobEnded = jobEnded || sp.Name == "images.job"
		}
		return len(ensureSpans(spans)) == 3 && jobEnded
	})
	byID := map[string]otlpsink.Span{}
	inTrace := map[string][]string{}
	for _, sp := range spans {
		byID[sp.SpanID] = sp
		inTrace[sp.TraceID] = append(inTrace[sp.TraceID], sp.Name)
		if sp.Service != "berth-imaged" {
			t.Errorf("span %s names service %q, want berth-imaged", sp.Name, sp.Service)
		}
	}
	parentName := func(sp otlpsink.Span) string {
		if p, ok := byID[sp.ParentID]; ok {
			return p.Name
		}
		return "(caller " + sp.ParentID + ")"
	}
	var sandboxTag string
	for _, sp := range spans {
		want := map[string]string{
			"images.resolve":          "images.ensure",
			"images.build":            "images.ensure",
			"images.check_arch":       "images.build",
			"images.sandbox_image":    "images.build",
			"images.isolation_image":  "images.build",
			"images.ensure":           "(caller " + buildParent + ")",
			"images.job":              "(caller " + jobParent + ")",
			"images.resolve in a job": "images.job",
		}
		name := sp.Name
		switch {
		case sp.TraceID == againTrace:
			want["images.ensure"] = "(caller " + againParent + ")"
		case sp.TraceID == jobTrace && name == "images.resolve":
			name = "images.resolve in a job"
		case sp.TraceID != buildTrace:
			continue
		}
		if _, ok := want[name]; !ok {
			t.Errorf("span %s (trace %s) is not one of berth-imaged's: berth's traces hold berth's spans", sp.Name, sp.TraceID)
			continue
		}
		if got := parentName(sp); got != want[name] {
			t.Errorf("span %s of trace %s has parent %s, want %s", sp.Name, sp.TraceID, got, want[name])
		}
		if sp.Name == "images.sandbox_image" {
			sandboxTag = sp.Attributes["berth.image.tag"]
		}
		if sp.Failed {
			t.Errorf("span %s failed: %s", sp.Name, sp.Error)
		}
	}
	if sandboxTag != "" {
		f.removeImagesAtEnd(t, sandboxTag)
	}
	for _, name := range []string{"images.ensure", "images.resolve", "images.build", "images.check_arch", "images.sandbox_image", "images.isolation_image"} {
		if !slices.Contains(inTrace[buildTrace], name) {
			t.Errorf("the building call's trace holds %v, not %s", inTrace[buildTrace], name)
		}
	}
	if slices.Contains(inTrace[againTrace], "images.build") || slices.Contains(inTrace[jobTrace], "images.build") {
		t.Errorf("a call that found the image built it: %v, %v", inTrace[againTrace], inTrace[jobTrace])
	}
	outcomes := map[string]string{}
	for _, sp := range ensureSpans(spans) {
		outcomes[sp.TraceID] = sp.Attributes["berth.image.outcome"]
		if sp.Attributes["berth.agent"] != "traced" || sp.Attributes["berth.image.tag"] != tag {
			t.Errorf("span images.ensure names agent %q and image %q, want traced and %s", sp.Attributes["berth.agent"], sp.Attributes["berth.image.tag"], tag)
		}
		if sp.TraceID != buildTrace && sp.TraceID != againTrace && sp.ParentID != "" {
			t.Errorf("the call without a traceparent has parent %s, want a root", sp.ParentID)
		}
	}
	if outcomes[buildTrace] != "built" || outcomes[againTrace] != "present" {
		t.Errorf("outcomes %v: want built, then present", outcomes)
	}
}
