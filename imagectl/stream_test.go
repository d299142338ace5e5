package imagectl_test

import (
	"archive/tar"
	"context"
	"errors"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/imagectl"
	"github.com/berth-dev/berth/internal/testkit/testdocker"
	"github.com/berth-dev/berth/internal/testkit/testenv"
)

func TestAFailingStepIsNamedWithItsLastLines(t *testing.T) {
	t.Parallel()
	cli := testdocker.Engine(t)
	_, err := os.Stat(imagectl.DefaultBusybox)
	testenv.Need(t, err == nil, "busybox-static is not installed")
	needBusyboxImage := imagectl.AgentImage{AgentBinary: buildAgent(t)}
	base, err := imagectl.Ensure(context.Background(), cli, needBusyboxImage)
	if err != nil {
		t.Fatal(err)
	}
	df := "FROM " + base + "\nRUN [\"/bin/sh\", \"-c\", \"echo preparing; echo the-last-words; exit 3\"]\n"
	var lines []string
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err = imagectl.StreamBuild(ctx, cli, func(w io.Writer) error {
		tw := tar.NewWriter(w)
		tw.WriteHeader(&tar.Header{Name: "Dockerfile", Mode: 0o644, Size: int64(len(df)), Typeflag: tar.TypeReg})
		tw.Write([]byte(df))
		return tw.Close()
	}, imagectl.StreamOptions{Tag: "berth-test-failing:1", OnLine: func(l string) { lines = append(lines, l) }})
	var be *imagectl.BuildError
	if !errors.As(err, &be) {
		t.Fatalf("build error = %v, want a BuildError", err)
	}
	if !strings.HasPrefix(be.Step, "Step 2/2 : RUN") || !strings.Contains(strings.Join(be.Tail, "\n"), "the-last-words") || !strings.Contains(be.Message, "returned a non-zero code: 3") {
		t.Fatalf("BuildError step %q, message %q, tail %q: want step 2's RUN, its exit code and its last line", be.Step, be.Message, be.Tail)
	}
	if !strings.Contains(strings.Join(lines, "\n"), "preparing") {
		t.Fatalf("the output was not streamed line by line: %q", lines)
	}
}
