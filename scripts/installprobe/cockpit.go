package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/berth-dev/berth/internal/testkit/cockpittest"
)

// cockpit drives Debian's Chromium, headless, through berth's Cockpit page
// as an admin and as a plain user, against the real cockpit-ws of the
// install test's container. It runs on the host inside the container's
// network namespace (nsenter --net), so Cockpit is on the container's own
// loopback, and reaches into the container with docker exec. It saves a
// screenshot of each page in --out and prints their paths.
func cockpit(args []string) error {
	fs := flag.NewFlagSet("cockpit", flag.ContinueOnError)
	url := fs.String("url", "http://127.0.0.1:9090", "Cockpit's address")
	container := fs.String("container", "", "the install test's container")
	admin := fs.String("admin", "", "a user in group berth-admin")
	adminPasswordFile := fs.String("admin-password-file", "", "the admin's password")
	plain := fs.String("user", "", "a user berth's D-Bus policy refuses")
	plainPasswordFile := fs.String("user-password-file", "", "the plain user's password")
	out := fs.String("out", "", "directory for the screenshots")
	dockerEngine := fs.Bool("docker", false, "the container has a Docker engine: build the default image")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *container == "" || *admin == "" || *plain == "" || *out == "" {
		return errors.New("--container, --admin, --user and --out are required")
	}
	adminPassword, err := readSecret(*adminPasswordFile)
	if err != nil {
		return fmt.Errorf("cannot read the admin's password: %w", err)
	}
	plainPassword, err := readSecret(*plainPasswordFile)
	if err != nil {
		return fmt.Errorf("cannot read the plain user's password: %w", err)
	}
	chromium, err := cockpittest.FindChromium()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return fmt.Errorf("cannot create %s: %w", *out, err)
	}
	profiles, err := os.MkdirTemp("", "installprobe-chromium-")
	if err != nil {
		return fmt.Errorf("cannot create browser profiles: %w", err)
	}
	defer os.RemoveAll(profiles)
	p := &pageProbe{url: *url, container: *container, out: *out}

	runID, err := p.asAdmin(chromium, filepath.Join(profiles, "admin"), *admin, string(adminPassword), *dockerEngine)
	if err != nil {
		return fmt.Errorf("as %s (berth-admin): %w", *admin, err)
	}
	if err := p.asPlainUser(chromium, filepath.Join(profiles, "plain"), *plain, string(plainPassword), runID); err != nil {
		return fmt.Errorf("as %s (plain user): %w", *plain, err)
	}
	return nil
}

type pageProbe struct {
	url, container, out string
	b                   *cockpittest.Browser
}

// Within the page's refresh period (10 s): what shows sooner came live.
const live = 9 * time.Second

// frame is a JS expression evaluated with d, the berth frame's document,
// and w, its window, once the page's first refresh is done (false before).
func frame(expr string) string {
	return `(() => { const f = document.querySelector('iframe[name$="/berth"]'); const d = f && f.contentDocument; const w = f && f.contentWindow;
		if (!d || !d.body || d.body.dataset.ready !== "true") return false;
		return (` + expr + `); })()`
}

func (p *pageProbe) waitFrame(timeout time.Duration, expr string) error {
	if err := p.b.WaitForInFrames(timeout, frame(expr)); err != nil {
		text, _ := cockpittest.Eval[string](p.b, 5*time.Second, frame(`d.body.innerText`))
		return fmt.Errorf("%w\nthe page shows:\n%s", err, text)
	}
	return nil
}

func (p *pageProbe) frameString(expr string) (string, error) {
	return cockpittest.Eval[string](p.b, 10*time.Second, frame(`String(`+expr+`)`))
}

// goTo switches the page's view as its tabs do, without reloading it.
func (p *pageProbe) goTo(fragment string) error {
	_, err := cockpittest.Eval[bool](p.b, 10*time.Second, frame(`(w.location.hash = `+strconv.Quote("#"+fragment)+`, true)`))
	return err
}

func (p *pageProbe) screenshot(name string) error {
	path := filepath.Join(p.out, name)
	if err := p.b.Screenshot(path); err != nil {
		return err
	}
	fmt.Println("screenshot:", path)
	return nil
}

func (p *pageProbe) login(chromium, profile, user, password string) error {
	b, err := cockpittest.StartBrowser(chromium, profile, 1280, 900)
	if err != nil {
		return err
	}
	p.b = b
	if err := b.Login(30*time.Second, p.url, user, password); err != nil {
		return err
	}
	if err := b.Go(30*time.Second, p.url+"/berth#/"); err != nil {
		return err
	}
	return p.waitFrame(30*time.Second, `true`)
}

// inside runs a command in the container.
func (p *pageProbe) inside(timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, "docker", append([]string{"exec", p.container}, args...)...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out)), nil
}

var units = []string{"berth-intake.socket", "berth-intake.service", "berth-scheduler.service", "berth-imaged.service"}

func (p *pageProbe) asAdmin(chromium, profile, user, password string, dockerEngine bool) (string, error) {
	if err := p.login(chromium, profile, user, password); err != nil {
		return "", err
	}
	defer p.b.Close()

	// Overview: every unit's state as systemctl tells it.
	for _, u := range units {
		show, err := p.inside(20*time.Second, "systemctl", "show", "-p", "ActiveState", "-p", "SubState", "--value", u)
		if err != nil {
			return "", err
		}
		active, sub, _ := strings.Cut(show, "\n")
		want := active
		if sub != "" && sub != active {
			want += " (" + sub + ")"
		}
		if err := p.waitFrame(live, `d.querySelector('#units-table [data-unit="`+u+`"] .berth-unit-state')?.textContent === `+strconv.Quote(want)); err != nil {
			return "", fmt.Errorf("the overview does not show %s as %q (systemctl's state): %w", u, want, err)
		}
	}
	if err := p.waitFrame(live, `d.getElementById("sched-presence").textContent.includes("running")`); err != nil {
		return "", fmt.Errorf("the overview does not show the scheduler running: %w", err)
	}
	if err := p.screenshot("cockpit-overview.png"); err != nil {
		return "", err
	}

	// Runs: a message sent with berthctl appears and finishes, live.
	if err := p.goTo("/runs"); err != nil {
		return "", err
	}
	if err := p.waitFrame(live, `d.body.dataset.view === "runs" && d.getElementById("runs-error").hidden`); err != nil {
		return "", err
	}
	if _, err := cockpittest.Eval[bool](p.b, 10*time.Second, frame(`(w.berthNoReload = true)`)); err != nil {
		return "", err
	}
	sent, err := p.send("ops", "/sh sleep 3; echo sent-from-cockpit-test")
	if err != nil {
		return "", err
	}
	row := `d.querySelector('#runs-table tr[data-run-id=` + strconv.Quote(sent.runID) + `]')`
	if err := p.waitFrame(live, row+`?.dataset.state === "running"`); err != nil {
		return "", fmt.Errorf("run %s never showed running: %w", sent.runID, err)
	}
	if err := p.waitFrame(30*time.Second, row+`?.dataset.state === "succeeded"`); err != nil {
		return "", fmt.Errorf("run %s never showed succeeded: %w", sent.runID, err)
	}
	if err := <-sent.done; err != nil {
		return "", err
	}
	if v, err := p.frameString(`w.berthNoReload === true`); err != nil || v != "true" {
		return "", fmt.Errorf("the page reloaded to show the run; it must update live (%v)", err)
	}
	if err := p.screenshot("cockpit-runs.png"); err != nil {
		return "", err
	}

	// The run's detail: the message and the agent's reply.
	if _, err := cockpittest.Eval[bool](p.b, 10*time.Second, frame(`(`+row+`.querySelector("a").click(), true)`)); err != nil {
		return "", err
	}
	if err := p.waitFrame(live, `d.getElementById("run-reply").textContent.includes("sent-from-cockpit-test")`); err != nil {
		return "", fmt.Errorf("the run's detail does not show the reply: %w", err)
	}
	if text, err := p.frameString(`d.getElementById("run-text").textContent`); err != nil || text != "/sh sleep 3; echo sent-from-cockpit-test" {
		return "", fmt.Errorf("the run's detail shows the message as %q (%v)", text, err)
	}
	if err := p.screenshot("cockpit-run.png"); err != nil {
		return "", err
	}

	// Images.
	if err := p.goTo("/images"); err != nil {
		return "", err
	}
	var before map[string]bool
	if dockerEngine {
		if err := p.waitFrame(30*time.Second, `d.getElementById("images-notice").textContent === "berth-imaged is running." && d.getElementById("images-error").hidden && !d.getElementById("images-body").hidden`); err != nil {
			return "", fmt.Errorf("the Images page does not list images: %w", err)
		}
		if before, err = p.imageTags(); err != nil {
			return "", err
		}
		if err := p.build(); err != nil {
			return "", err
		}
	} else if err := p.imagesWithoutDocker(); err != nil {
		return "", err
	}
	if err := p.screenshot("cockpit-images.png"); err != nil {
		return "", err
	}
	if dockerEngine {
		if err := p.removeBuilt(before); err != nil {
			return "", err
		}
	}
	return sent.runID, nil
}

// imagesWithoutDocker: berth-imaged starts, and the page shows why it has
// no images instead of an empty list.
func (p *pageProbe) imagesWithoutDocker() error {
	if err := p.waitFrame(30*time.Second, `d.getElementById("images-notice").textContent === "berth-imaged is running." && !d.getElementById("images-error").hidden`); err != nil {
		return fmt.Errorf("the Images page does not show that berth has no Docker engine: %w", err)
	}
	msg, err := p.frameString(`d.getElementById("images-error").textContent`)
	if err != nil {
		return err
	}
	if !strings.Contains(strings.ToLower(msg), "docker") {
		return fmt.Errorf("the Images page's error does not name Docker: %q", msg)
	}
	fmt.Printf("images page without a Docker engine says: %s\n", msg)
	// The Dockerfile preview needs no engine; a build says why it cannot run.
	if _, err := cockpittest.Eval[bool](p.b, 10*time.Second, frame(`(d.getElementById("dockerfile-button").click(), true)`)); err != nil {
		return err
	}
	if err := p.waitFrame(live, `!d.getElementById("dockerfile").hidden && d.getElementById("dockerfile").textContent.includes("FROM")`); err != nil {
		return fmt.Errorf("the Dockerfile preview does not work without Docker: %w", err)
	}
	if _, err := cockpittest.Eval[bool](p.b, 10*time.Second, frame(`(d.getElementById("build-button").click(), true)`)); err != nil {
		return err
	}
	const said = `(d.getElementById("build-status").textContent + " " + d.getElementById("images-error").textContent)`
	if err := p.waitFrame(30*time.Second, `/fail|docker/i.test(d.getElementById("build-status").textContent) || d.getElementById("images-error").textContent.includes("Building")`); err != nil {
		return fmt.Errorf("a build without Docker does not say why it cannot run: %w", err)
	}
	build, _ := p.frameString(said)
	fmt.Printf("a build without a Docker engine says: %s\n", build)
	return nil
}

// build starts a build of the default image and waits for its end.
func (p *pageProbe) build() error {
	if err := p.waitFrame(live, `d.getElementById("build-button").disabled === false`); err != nil {
		return err
	}
	// No cache: the host's engine may hold the image from an earlier run,
	// and a build that has nothing to do shows no progress.
	if _, err := cockpittest.Eval[bool](p.b, 10*time.Second, frame(`(d.getElementById("build-no-cache").checked = true, d.getElementById("build-button").click(), true)`)); err != nil {
		return err
	}
	if err := p.waitFrame(5*time.Minute, `d.getElementById("build-status").textContent.startsWith("Built ") || d.getElementById("build-status").textContent.includes("failed")`); err != nil {
		return err
	}
	status, _ := p.frameString(`d.getElementById("build-status").textContent`)
	if !strings.HasPrefix(status, "Built ") {
		return fmt.Errorf("the build says %q", status)
	}
	full, _ := p.frameString(`(() => { const b = d.getElementById("build-progress"); return b.value === b.max && b.max > 1 })()`)
	if full != "true" {
		return errors.New("the build's progress bar did not reach its end")
	}
	if log, _ := p.frameString(`d.getElementById("build-log").textContent`); log == "" {
		return errors.New("the build showed no log lines")
	}
	tag := strings.TrimPrefix(status, "Built ")
	row := `d.querySelector('#images-table tr[data-tag=` + strconv.Quote(tag) + `]')`
	if err := p.waitFrame(live, `!!`+row); err != nil {
		return fmt.Errorf("the built image %s is not in the list: %w", tag, err)
	}
	fmt.Printf("built %s from the Images page\n", tag)
	return nil
}

// removeBuilt removes the images the build made (they live in the host's
// engine) with the page's Remove buttons, the isolation image before the
// agent image it is made from.
func (p *pageProbe) removeBuilt(before map[string]bool) error {
	listed, err := p.frameString(`[...d.querySelectorAll("#images-table tr[data-tag]")].map(r => r.dataset.tag).join("\n")`)
	if err != nil {
		return err
	}
	var made []string
	for _, tag := range strings.Split(listed, "\n") {
		if tag != "" && !before[tag] {
			made = append(made, tag)
		}
	}
	sort.SliceStable(made, func(i, j int) bool {
		return strings.HasPrefix(made[i], "berth-isolated:") && !strings.HasPrefix(made[j], "berth-isolated:")
	})
	for _, tag := range made {
		row := `d.querySelector('#images-table tr[data-tag=` + strconv.Quote(tag) + `]')`
		if _, err := cockpittest.Eval[bool](p.b, 10*time.Second, frame(`(d.getElementById("images-done").textContent = "", `+row+`.querySelector("button[data-remove]").click(), true)`)); err != nil {
			return fmt.Errorf("cannot press Remove of %s: %w", tag, err)
		}
		if err := p.waitFrame(live, `d.getElementById("images-done").textContent.includes("Removed")`); err != nil {
			return fmt.Errorf("removing %s: %w", tag, err)
		}
		fmt.Printf("removed %s from the Images page\n", tag)
	}
	return nil
}

// imageTags are the tags the Images page lists.
func (p *pageProbe) imageTags() (map[string]bool, error) {
	listed, err := p.frameString(`[...d.querySelectorAll("#images-table tr[data-tag]")].map(r => r.dataset.tag).join("\n")`)
	if err != nil {
		return nil, err
	}
	tags := map[string]bool{}
	for _, tag := range strings.Split(listed, "\n") {
		tags[tag] = true
	}
	return tags, nil
}

func (p *pageProbe) asPlainUser(chromium, profile, user, password, adminRun string) error {
	if err := p.login(chromium, profile, user, password); err != nil {
		return err
	}
	defer p.b.Close()

	if err := p.goTo("/runs"); err != nil {
		return err
	}
	if err := p.waitFrame(live, `d.getElementById("access-notice").hidden === false && d.getElementById("access-notice").textContent.includes("berth-admin")`); err != nil {
		return fmt.Errorf("the page does not tell a plain user that admin actions need berth-admin: %w", err)
	}
	if err := p.waitFrame(live, `d.getElementById("runs-error").textContent.includes("AccessDenied")`); err != nil {
		return fmt.Errorf("the runs list does not show the refusal: %w", err)
	}
	if err := p.screenshot("cockpit-runs-refused.png"); err != nil {
		return err
	}

	// A direct call from the page to what the policy refuses.
	call := `(w.berthDirect = undefined, w.cockpit.dbus("dev.berth.Scheduler1", { bus: "system" })
		.call("/dev/berth/Scheduler1", "dev.berth.Scheduler1", "CancelRun", [` + strconv.Quote(adminRun) + `])
		.then(() => { w.berthDirect = "allowed" }, e => { w.berthDirect = String(e.name || "") + ": " + String(e.message || e) }), true)`
	if _, err := cockpittest.Eval[bool](p.b, 10*time.Second, frame(call)); err != nil {
		return err
	}
	if err := p.waitFrame(30*time.Second, `w.berthDirect !== undefined`); err != nil {
		return err
	}
	answer, err := p.frameString(`w.berthDirect`)
	if err != nil {
		return err
	}
	if !strings.Contains(answer, "AccessDenied") {
		return fmt.Errorf("a plain user's direct CancelRun was answered %q, want AccessDenied", answer)
	}
	fmt.Printf("a plain user's direct CancelRun: %s\n", answer)

	// Admin actions on the Images page are disabled with the reason.
	if err := p.goTo("/images"); err != nil {
		return err
	}
	for _, id := range []string{"build-button", "images-clean", "images-clean-all"} {
		if err := p.waitFrame(live, `d.getElementById("`+id+`").disabled === true && d.getElementById("`+id+`").title.includes("berth-admin")`); err != nil {
			return fmt.Errorf("%s is not disabled for a plain user: %w", id, err)
		}
	}
	return p.screenshot("cockpit-images-refused.png")
}

type sentMessage struct {
	runID string
	done  chan error
}

var queuedRe = regexp.MustCompile(`^run (\S+) queued for agent `)

// send runs berthctl send in the container and returns once it has named
// its run; done reports the reply.
func (p *pageProbe) send(agent, text string) (*sentMessage, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	cmd := exec.CommandContext(ctx, "docker", "exec", p.container, "berthctl", "send", "--timeout", "60s", agent, text)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		cancel()
		return nil, err
	}
	var stdout strings.Builder
	cmd.Stdout = &stdout
	if err := cmd.Start(); err != nil {
		cancel()
		return nil, fmt.Errorf("cannot run berthctl send: %w", err)
	}
	ids := make(chan string, 1)
	var said strings.Builder
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			said.WriteString(sc.Text() + "\n")
			if m := queuedRe.FindStringSubmatch(sc.Text()); m != nil {
				ids <- m[1]
			}
		}
		close(ids)
	}()
	id, ok := <-ids
	if !ok {
		err := cmd.Wait()
		cancel()
		return nil, fmt.Errorf("berthctl send named no run (%v): %s", err, said.String())
	}
	done := make(chan error, 1)
	go func() {
		defer cancel()
		for range ids {
		}
		err := cmd.Wait()
		if err == nil && !strings.Contains(stdout.String(), "sent-from-cockpit-test") {
			err = fmt.Errorf("berthctl send's reply: %q", stdout.String())
		}
		done <- err
	}()
	return &sentMessage{runID: id, done: done}, nil
}
