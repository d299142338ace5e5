package imagectl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"

	"github.com/moby/moby/client"
)

// StreamOptions describes one build through StreamBuild.
type StreamOptions struct {
	Tag     string
	Labels  map[string]string
	NoCache bool
	// Network is the build containers' network: "none" unless the build
	// must reach a mirror itself (BuildNetwork).
	Network string
	// OnLine receives every line of the builder's output as it arrives.
	OnLine func(line string)
}

// TailLines is how many lines of output a BuildError keeps.
const TailLines = 20

// BuildError is a failed build: the step that failed, the builder's message
// and the last lines of output.
type BuildError struct {
	Tag     string
	Step    string // "Step 3/4 : RUN ..." ("" before the first step)
	Message string
	Tail    []string
}

func (e *BuildError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "cannot build image %s", e.Tag)
	if e.Step != "" {
		fmt.Fprintf(&b, " at %s", e.Step)
	}
	fmt.Fprintf(&b, ": %s", e.Message)
	if len(e.Tail) > 0 {
		b.WriteString("\n" + strings.Join(e.Tail, "\n"))
	}
	return b.String()
}

var stepPattern = regexp.MustCompile(`^Step (\d+)/(\d+) : `)

// ParseStep reads the classic builder's "Step N/M : ..." line.
func ParseStep(line string) (step, total int, ok bool) {
	m := stepPattern.FindStringSubmatch(line)
	if m == nil {
		return 0, 0, false
	}
	step, _ = strconv.Atoi(m[1])
	total, _ = strconv.Atoi(m[2])
	return step, total, true
}

// StreamBuild builds an image from the context writeContext produces. The
// tar is written into a pipe as the engine reads it (never whole in
// memory), and the builder's output goes to OnLine line by line as it
// arrives. It returns the new image's ID.
func StreamBuild(ctx context.Context, cli *client.Client, writeContext func(io.Writer) error, opts StreamOptions) (string, error) {
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(writeContext(pw)) }()
	defer pr.Close()
	network := opts.Network
	if network == "" {
		network = "none"
	}
	res, err := cli.ImageBuild(ctx, pr, client.ImageBuildOptions{
		Tags:        []string{opts.Tag},
		Labels:      opts.Labels,
		NoCache:     opts.NoCache,
		Remove:      true,
		ForceRemove: true,
		NetworkMode: network,
	})
	if err != nil {
		return "", fmt.Errorf("cannot build image %s: %w", opts.Tag, err)
	}
	defer res.Body.Close()

	var (
		tail    []string
		step    string
		partial string
	)
	emit := func(line string) {
		line = strings.TrimRight(line, "\r")
		if _, _, ok := ParseStep(line); ok {
			step = line
		}
		tail = append(tail, line)
		if len(tail) > TailLines {
			tail = tail[len(tail)-TailLines:]
		}
		if opts.OnLine != nil {
			opts.OnLine(line)
		}
	}
	dec := json.NewDecoder(res.Body)
	for {
		var msg struct {
			Stream      string `json:"stream"`
			Status      string `json:"status"`
			Error       string `json:"error"`
			ErrorDetail struct {
				Message string `json:"message"`
			} `json:"errorDetail"`
		}
		if err := dec.Decode(&msg); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return "", fmt.Errorf("cannot read the build of %s: %w", opts.Tag, err)
		}
		text := partial + msg.Stream + msg.Status
		lines := strings.Split(text, "\n")
		partial = lines[len(lines)-1]
		for _, l := range lines[:len(lines)-1] {
			emit(l)
		}
		if msg.Error != "" {
			if partial != "" {
				emit(partial)
			}
			return "", &BuildError{Tag: opts.Tag, Step: step, Message: strings.TrimSpace(msg.Error), Tail: tail}
		}
	}
	if partial != "" {
		emit(partial)
	}
	img, err := cli.ImageInspect(ctx, opts.Tag)
	if err != nil {
		return "", &BuildError{Tag: opts.Tag, Step: step, Message: fmt.Sprintf("the image is missing after its build: %v", err), Tail: tail}
	}
	return img.ID, nil
}

// Steps counts a Dockerfile's instructions, as the builder numbers them.
func Steps(dockerfile string) int {
	n, cont := 0, false
	for line := range strings.SplitSeq(dockerfile, "\n") {
		t := strings.TrimSpace(line)
		if !cont && t != "" && !strings.HasPrefix(t, "#") {
			n++
		}
		cont = strings.HasSuffix(t, `\`)
	}
	return n
}
