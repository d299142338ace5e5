package ctl

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/berth-dev/berth/internal/busapi"
)

// containerUsage is the usage of `berthctl container`.
const containerUsage = `usage: berthctl container COMMAND
  build [--agent ID] [--no-cache]   build ID's images (default: the global [image_config]) and follow the build
  status                            is berth-imaged reachable, builds running, images known
  images [--json]                   berth's images: tag, kind, status, present or missing, size, last used, agents
  clean [--all]                     remove images no agent uses (--all: every berth image); never one a container uses
  dockerfile [--agent ID]           the Dockerfiles ID's images are built from; builds nothing
  rm TAG                            remove one berth image`

func (c *cli) container(args []string) error {
	if len(args) == 0 {
		return usageError("%s", containerUsage)
	}
	switch args[0] {
	case "build":
		return c.containerBuild(args[1:])
	case "status":
		return c.containerStatus(args[1:])
	case "images":
		return c.containerImages(args[1:])
	case "clean":
		return c.containerClean(args[1:])
	case "dockerfile":
		return c.containerDockerfile(args[1:])
	case "rm":
		return c.containerRemove(args[1:])
	}
	return usageError("unknown container command %q\n%s", args[0], containerUsage)
}

func (c *cli) images() (busapi.Images, error) {
	conn, err := c.connect()
	if err != nil {
		return busapi.Images{}, err
	}
	return busapi.NewImages(conn), nil
}

// parseTarget parses fs (which has --agent) and returns the build target:
// the agent, or "default" (the global [image_config]) without one.
func parseTarget(fs *flag.FlagSet, agent *string, args []string) (string, error) {
	if err := fs.Parse(args); err != nil {
		return "", usageError("%v\n%s", err, containerUsage)
	}
	if fs.NArg() > 0 {
		return "", usageError("unexpected argument %q\n%s", fs.Arg(0), containerUsage)
	}
	if *agent == "" {
		return "default", nil
	}
	return *agent, nil
}

func (c *cli) containerBuild(args []string) error {
	fs := newFlags("container build")
	agent := fs.String("agent", "", "agent id")
	noCache := fs.Bool("no-cache", false, "rebuild every step")
	target, err := parseTarget(fs, agent, args)
	if err != nil {
		return err
	}
	images, err := c.images()
	if err != nil {
		return err
	}
	job, err := images.Build(context.Background(), busapi.BuildTarget{Target: target, NoCache: *noCache})
	if err != nil {
		return fmt.Errorf("cannot start the build: %w", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	show := c.progressView()
	defer show.done()
	canceled := false
	// Follow ends when the job does (or is lost), also after a Cancel.
	progress := job.Follow(context.Background())
	for {
		select {
		case <-ctx.Done():
			if !canceled {
				canceled = true
				show.line(0, 0, "canceling the build")
				if err := job.Cancel(context.Background()); err != nil {
					return fmt.Errorf("cannot cancel job %s: %w", job.Path, err)
				}
			}
			ctx = context.Background()
		case p, ok := <-progress:
			switch {
			case !ok:
				return fmt.Errorf("lost job %s", job.Path)
			case p.Lost != nil:
				return p.Lost
			case p.Finished:
				return c.buildEnded(show, p.Tag, p.Error, canceled)
			}
			show.line(p.Step, p.Total, p.Line)
		}
	}
}

func (c *cli) buildEnded(show progressView, tag, errText string, canceled bool) error {
	show.done()
	if errText != "" {
		if canceled {
			return &exitErr{ExitFailed, "build canceled"}
		}
		return &exitErr{ExitFailed, "build failed: " + errText}
	}
	fmt.Fprintln(c.out, tag)
	return nil
}

// progressView shows a build: a bar with the current step on a terminal,
// plain lines otherwise.
type progressView interface {
	line(step, total uint32, text string)
	done()
}

func (c *cli) progressView() progressView {
	if f, ok := c.out.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		return &barView{w: f}
	}
	return &plainView{c: c}
}

type plainView struct {
	c *cli
}

func (v *plainView) line(step, total uint32, text string) {
	if total > 0 {
		fmt.Fprintf(v.c.errOut, "[%d/%d] %s\n", step, total, text)
		return
	}
	fmt.Fprintln(v.c.errOut, text)
}

func (v *plainView) done() {}

type barView struct {
	w     *os.File
	bar   *progressbar.ProgressBar
	total uint32
	ended bool
}

func (v *barView) line(step, total uint32, text string) {
	if v.ended {
		return
	}
	if v.bar == nil || total != v.total {
		if v.bar != nil {
			v.bar.ChangeMax(int(total))
		} else {
			v.bar = progressbar.NewOptions(int(max(total, 1)), progressbar.OptionSetWriter(v.w), progressbar.OptionShowCount(),
				progressbar.OptionSetPredictTime(false), progressbar.OptionFullWidth(), progressbar.OptionClearOnFinish())
		}
		v.total = total
	}
	if strings.HasPrefix(text, "Step ") || strings.HasPrefix(text, "fetching ") || strings.HasPrefix(text, "building ") {
		width := 40
		if w, _, err := term.GetSize(int(v.w.Fd())); err == nil && w > 60 {
			width = w / 2
		}
		if len(text) > width {
			text = text[:width] + "…"
		}
		v.bar.Describe(text)
	}
	_ = v.bar.Set(int(step))
}

func (v *barView) done() {
	if v.bar != nil && !v.ended {
		_ = v.bar.Finish()
		fmt.Fprintln(v.w)
	}
	v.ended = true
}

func (c *cli) containerStatus(args []string) error {
	if len(args) > 0 {
		return usageError("%s", containerUsage)
	}
	images, err := c.images()
	if err != nil {
		return err
	}
	// ListImages first: it starts berth-imaged when it is not running, and
	// reading properties does not.
	list, err := images.ListImages(context.Background())
	if err != nil {
		return fmt.Errorf("cannot list images: %w", err)
	}
	st, err := images.Properties(context.Background())
	if err != nil {
		return fmt.Errorf("berth-imaged is not reachable: %w", err)
	}
	var missing, failed []string
	for _, img := range list {
		switch {
		case img.Status == "failed":
			failed = append(failed, img.Tag)
		case !img.Present:
			missing = append(missing, img.Tag)
		}
	}
	fmt.Fprintf(c.out, "berth-imaged: running\nbuilding:     %d\nimages:       %d\n", st.Building, st.ImageCount)
	if len(missing) > 0 {
		fmt.Fprintf(c.out, "missing:      %s (removed from the engine; rebuilt on next use)\n", strings.Join(missing, " "))
	}
	if len(failed) > 0 {
		fmt.Fprintf(c.out, "failed:       %s (berthctl container images shows why)\n", strings.Join(failed, " "))
	}
	return nil
}

func (c *cli) containerImages(args []string) error {
	fs := newFlags("container images")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args); err != nil || fs.NArg() > 0 {
		return usageError("%s", containerUsage)
	}
	images, err := c.images()
	if err != nil {
		return err
	}
	rows, err := images.ListImages(context.Background())
	if err != nil {
		return fmt.Errorf("cannot list images: %w", err)
	}
	if *asJSON {
		enc := json.NewEncoder(c.out)
		enc.SetIndent("", "  ")
		return enc.Encode(rows)
	}
	return writeImages(c.out, rows)
}

// writeImages prints berth's images as `container images` does: a table,
// then each failed build's error and last lines.
func writeImages(w io.Writer, rows []busapi.Image) error {
	if len(rows) == 0 {
		fmt.Fprintln(w, "no images yet (berthctl container build, or the first container run, builds them)")
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TAG\tKIND\tSTATUS\tSIZE\tLAST USED\tAGENTS")
	for _, r := range rows {
		status := r.Status
		if !r.Present && status == "ready" {
			status = "missing"
		}
		size := "-"
		if r.Present {
			size = humanBytes(r.Size)
		}
		last := r.LastUsed
		if last == "" {
			last = "never"
		}
		agents := strings.Join(r.Agents, ",")
		if agents == "" {
			agents = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.Tag, r.Kind, status, size, last, agents)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range rows {
		if r.Error != "" {
			fmt.Fprintf(w, "\n%s failed: %s\n", r.Tag, firstLine(r.Error))
			for _, l := range r.LogTail {
				fmt.Fprintf(w, "  %s\n", l)
			}
		}
	}
	return nil
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

func (c *cli) containerClean(args []string) error {
	fs := newFlags("container clean")
	all := fs.Bool("all", false, "every berth image")
	if err := fs.Parse(args); err != nil || fs.NArg() > 0 {
		return usageError("%s", containerUsage)
	}
	images, err := c.images()
	if err != nil {
		return err
	}
	removed, err := images.Clean(context.Background(), *all)
	if err != nil {
		return fmt.Errorf("cannot clean images: %w", err)
	}
	sort.Strings(removed)
	if len(removed) == 0 {
		fmt.Fprintln(c.out, "nothing to remove")
	}
	for _, t := range slices.Compact(removed) {
		fmt.Fprintf(c.out, "removed %s\n", t)
	}
	return nil
}

func (c *cli) containerDockerfile(args []string) error {
	fs := newFlags("container dockerfile")
	agent := fs.String("agent", "", "agent id")
	target, err := parseTarget(fs, agent, args)
	if err != nil {
		return err
	}
	images, err := c.images()
	if err != nil {
		return err
	}
	df, err := images.Dockerfile(context.Background(), target)
	if err != nil {
		return fmt.Errorf("cannot make the Dockerfile of %s: %w", target, err)
	}
	fmt.Fprint(c.out, df)
	return nil
}

func (c *cli) containerRemove(args []string) error {
	if len(args) != 1 {
		return usageError("%s", containerUsage)
	}
	images, err := c.images()
	if err != nil {
		return err
	}
	if err := images.Remove(context.Background(), args[0]); err != nil {
		return fmt.Errorf("cannot remove %s: %w", args[0], err)
	}
	fmt.Fprintf(c.out, "removed %s\n", args[0])
	return nil
}
