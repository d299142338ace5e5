package images

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/godbus/dbus/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/tracing"
)

// Job is one Build request: it follows a build (its own, or one already
// running for the same image) and ends succeeded, failed or canceled.
type Job struct {
	s     *Service
	build *build // nil when the image was already there
	// span is the job's (images.job), ended with it.
	span trace.Span

	mu  sync.Mutex
	rec JobRecord
	// watchers get every change; the D-Bus object is one of them.
	watchers []func(JobRecord, string)
	done     chan struct{}
}

// Path is the job's D-Bus object path.
func (j *Job) Path() dbus.ObjectPath { return bus.ImagesJobPath(strconv.FormatUint(j.rec.ID, 10)) }

// Record is the job's current state.
func (j *Job) Record() JobRecord {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.rec
}

// Done is closed when the job has ended.
func (j *Job) Done() <-chan struct{} { return j.done }

// Cancel stops the job's build (and so every job and caller sharing it).
func (j *Job) Cancel() {
	if j.build != nil {
		j.mu.Lock()
		if j.rec.State == JobRunning {
			j.rec.State = JobCanceled
		}
		j.mu.Unlock()
		j.build.cancel()
	}
}

func (j *Job) notify(line string) {
	j.mu.Lock()
	rec, ws := j.rec, append([]func(JobRecord, string){}, j.watchers...)
	j.mu.Unlock()
	for _, w := range ws {
		w(rec, line)
	}
}

// watch registers f for the job's changes: each progress line, then its end
// (line "" and a final state).
func (j *Job) watch(f func(JobRecord, string)) {
	j.mu.Lock()
	j.watchers = append(j.watchers, f)
	j.mu.Unlock()
}

// StartJob starts building target's isolation image (and its container
// image) and returns the job at once. A target the config does not know, or
// whose base is missing, is an error and no job. With noCache every step is
// built again even when the images are present.
//
// The job is a span (images.job) under ctx's until it ends, and the build
// it starts hangs under that.
func (s *Service) StartJob(ctx context.Context, target string, noCache bool, beforeStart func(*Job)) (_ *Job, err error) {
	ctx, span := tracing.Tracer().Start(ctx, spanJob, trace.WithAttributes(
		attribute.String("berth.image.target", target), attribute.Bool("berth.image.no_cache", noCache)))
	defer func() {
		if err != nil {
			endSpan(span, err)
		}
	}()
	p, err := s.resolve(ctx, target)
	if err != nil {
		return nil, err
	}
	span.SetAttributes(imageAttrs(p)...)
	rec, err := s.store.newJob(p.target, s.clock.Now().UTC())
	if err != nil {
		return nil, err
	}
	span.SetAttributes(attribute.Int64("berth.image.job", int64(rec.ID)))
	j := &Job{s: s, rec: rec, done: make(chan struct{}), span: span}
	s.mu.Lock()
	s.jobs[rec.ID] = j
	s.mu.Unlock()
	if beforeStart != nil {
		beforeStart(j)
	}

	present := false
	if !noCache {
		ictx, cancel := s.engineCtx(ctx)
		_, err := s.engine.ImageInspect(ictx, p.tag)
		cancel()
		present = err == nil
	}
	if present {
		span.SetAttributes(attribute.String("berth.image.outcome", outcomePresent))
		s.used(ctx, p)
		go s.endJob(j, p.tag, nil)
		return j, nil
	}
	j.build = s.joinBuild(ctx, span, p, noCache)
	j.build.watch(func(step, total uint32, line string) {
		j.mu.Lock()
		j.rec.Step, j.rec.Total = step, total
		j.mu.Unlock()
		j.notify(line)
	})
	go func() {
		<-j.build.done
		s.endJob(j, p.tag, j.build.err)
	}()
	return j, nil
}

func (s *Service) endJob(j *Job, tag string, err error) {
	j.mu.Lock()
	switch {
	case j.rec.State == JobCanceled:
		j.rec.Error = "canceled"
	case err == nil:
		j.rec.State, j.rec.Tag = JobSucceeded, tag
		if j.rec.Total > 0 {
			j.rec.Step = j.rec.Total
		}
	default:
		j.rec.State, j.rec.Error = JobFailed, err.Error()
		if errors.Is(err, context.Canceled) || strings.Contains(err.Error(), " canceled") {
			j.rec.State = JobCanceled
		}
	}
	j.rec.Finished = s.clock.Now().UTC()
	rec := j.rec
	j.mu.Unlock()
	spanErr := err
	if rec.State == JobCanceled && err == nil {
		spanErr = context.Canceled
	}
	endSpan(j.span, spanErr)
	if err := s.store.finishJob(rec); err != nil {
		s.log.Error(err.Error())
	}
	if err == nil {
		s.touch(tag)
	}
	close(j.done)
	j.notify("")
}

// jobByID returns a job of this process.
func (s *Service) jobByID(id string) (*Job, error) {
	n, err := strconv.ParseUint(id, 10, 64)
	if err != nil {
		return nil, fmt.Errorf("%w: job %q", ErrNotFound, id)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	j, ok := s.jobs[n]
	if !ok {
		return nil, fmt.Errorf("%w: job %q", ErrNotFound, id)
	}
	return j, nil
}
