package images_test

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"github.com/berth-dev/berth/imagectl"
	"github.com/berth-dev/berth/internal/testkit/testdocker"
)

// The full-suite test of issue 9: a real Debian package on the
// debootstrapped base (scripts/base-image.sh), fetched by the host's apt and
// installed with no network in the build.
func TestSandboxImageInstallsARealDebianPackageWithNoNetworkInTheBuild(t *testing.T) {
	t.Parallel()
	cli := testdocker.Engine(t)
	needBase(t, cli)
	testenvNeedApt(t)
	n := nonce()
	cfg, _ := writeConfig(t, fmt.Sprintf("[[agents]]\nid = \"ops\"\n[agents.container_mode]\nenabled = true\n[agents.image_config]\nenabled = true\npackages = [\"jq\"]\nenv_vars = { RUN_NONCE = %q }\n", n))
	f := newService(t, cfg)
	tag := ensure(t, f, "ops")
	list, err := f.svc.ListImages(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var sandbox string
	for _, img := range list {
		if img.Kind == imagectl.KindSandbox {
			sandbox = img.Tag
			if img.Inputs["packages"] != "jq" || !img.Present || img.Size == 0 {
				t.Errorf("container image record: %+v, want packages jq, present, with a size", img)
			}
		}
	}
	f.removeImagesAtEnd(t, tag, sandbox)
	out, err := exec.Command("docker", "run", "--rm", "--network", "none", "--entrypoint", "/bin/sh", tag, "-c",
		`echo '{"answer":42}' | jq .answer; id -u; echo "$RUN_NONCE"; ls /var/lib/apt/lists | wc -l; ls /tmp`).CombinedOutput()
	fields := strings.Fields(string(out))
	if err != nil || len(fields) < 4 || fields[0] != "42" || fields[1] != "65534" || fields[2] != n || fields[3] != "0" {
		t.Fatalf("in %s: %q (%v); want jq to answer 42 as uid 65534 with RUN_NONCE set, no apt lists and no .debs left", tag, out, err)
	}
}
