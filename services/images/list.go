package images

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/imagectl"
)

// Image is one berth image as ListImages shows it: berth's record joined
// with the engine's view.
type Image struct {
	Record
	Present bool
	Agents  []string // configured agents whose container runs use it
}

// berthRepositories are the image repositories berth makes.
var berthRepositories = []string{imagectl.IsolatedRepository, imagectl.SandboxRepository, imagectl.Repository}

func isBerthTag(tag string) bool {
	repo, _, ok := strings.Cut(tag, ":")
	return ok && slices.Contains(berthRepositories, repo)
}

// kindOrder sorts removals so that an image goes before the one it is
// built on.
func kindOrder(tag string) int {
	repo, _, _ := strings.Cut(tag, ":")
	return slices.Index(berthRepositories, repo)
}

// engineImages lists the engine's berth images by tag.
func (s *Service) engineImages(ctx context.Context) (map[string]imageFacts, error) {
	lctx, cancel := s.engineCtx(ctx)
	defer cancel()
	res, err := s.engine.ImageList(lctx, client.ImageListOptions{})
	if err != nil {
		return nil, fmt.Errorf("%w: cannot list the engine's images: %v", ErrUnavailable, err)
	}
	out := map[string]imageFacts{}
	for _, img := range res.Items {
		for _, tag := range img.RepoTags {
			if isBerthTag(tag) {
				out[tag] = imageFacts{id: img.ID, size: img.Size, created: time.Unix(img.Created, 0).UTC(), kind: img.Labels[imagectl.LabelKind], hash: img.Labels[imagectl.LabelHash]}
			}
		}
	}
	return out, nil
}

type imageFacts struct {
	id, kind, hash string
	size           int64
	created        time.Time
}

// references maps each image tag configured agents' container runs use
// (isolation image, container image, default agent image) to those agents.
// An agent whose images cannot be resolved (its base is missing) references
// nothing new and is logged.
func (s *Service) references(ctx context.Context) map[string][]string {
	refs := map[string][]string{}
	cfg := s.cfg.Load()
	for _, id := range cfg.AgentIDs() {
		a, err := cfg.Agent(id)
		if err != nil || !a.Container.Enabled {
			continue
		}
		p, err := s.planFor(ctx, id)
		if err != nil {
			s.log.Warn("cannot resolve an agent's images", "agent", id, "err", err)
			continue
		}
		tags := []string{p.tag}
		if p.sandbox != nil {
			tags = append(tags, p.sandbox.Tag())
		}
		if p.agentImage != nil {
			tags = append(tags, imagectl.Tag(p.agentHash))
		}
		for _, t := range tags {
			refs[t] = append(refs[t], id)
		}
	}
	return refs
}

// ListImages joins images.db with the engine: every image berth-imaged
// built, present or missing (removed behind its back). Images it did not
// build are not its to show or clean.
func (s *Service) ListImages(ctx context.Context) ([]Image, error) {
	recs, bad, err := s.store.images()
	if err != nil {
		return nil, err
	}
	for _, e := range bad {
		s.log.Warn(e.Error())
	}
	engine, err := s.engineImages(ctx)
	if err != nil {
		return nil, err
	}
	refs := s.references(ctx)
	var out []Image
	for _, r := range recs {
		f, ok := engine[r.Tag]
		if ok {
			r.Size = f.size
		}
		out = append(out, Image{Record: r, Present: ok, Agents: refs[r.Tag]})
	}
	slices.SortFunc(out, func(a, b Image) int { return strings.Compare(a.Tag, b.Tag) })
	return out, nil
}

// inUse lists the image IDs and names any container (running or not) uses.
func (s *Service) inUse(ctx context.Context) (map[string]string, error) {
	lctx, cancel := s.engineCtx(ctx)
	defer cancel()
	res, err := s.engine.ContainerList(lctx, client.ContainerListOptions{All: true})
	if err != nil {
		return nil, fmt.Errorf("%w: cannot list the engine's containers: %v", ErrUnavailable, err)
	}
	used := map[string]string{}
	for _, c := range res.Items {
		name := strings.TrimPrefix(strings.Join(c.Names, ","), "/")
		used[c.ImageID] = name
		used[c.Image] = name
	}
	return used, nil
}

// Remove removes one berth image from the engine and its record. An image
// a container uses is refused.
func (s *Service) Remove(ctx context.Context, tag string) error {
	if !isBerthTag(tag) {
		return fmt.Errorf("%w: %q is not a berth image (berth-isolated:…, berth-sandbox:… or berth-agent:…)", ErrInvalidArgument, tag)
	}
	used, err := s.inUse(ctx)
	if err != nil {
		return err
	}
	engine, err := s.engineImages(ctx)
	if err != nil {
		return err
	}
	_, known, err := s.store.image(tag)
	if err != nil {
		return err
	}
	f, present := engine[tag]
	if !present && !known {
		return fmt.Errorf("%w: no berth image %s", ErrNotFound, tag)
	}
	if present {
		if c, ok := used[f.id]; ok {
			return fmt.Errorf("%w: image %s is used by container %s", ErrInUse, tag, c)
		}
		if c, ok := used[tag]; ok {
			return fmt.Errorf("%w: image %s is used by container %s", ErrInUse, tag, c)
		}
		if err := s.removeFromEngine(ctx, tag); err != nil {
			return err
		}
	}
	if err := s.store.deleteImage(tag); err != nil {
		return err
	}
	s.changed()
	s.log.Info("image removed", "image", tag)
	return nil
}

func (s *Service) removeFromEngine(ctx context.Context, tag string) error {
	rctx, cancel := s.engineCtx(ctx)
	defer cancel()
	_, err := s.engine.ImageRemove(rctx, tag, client.ImageRemoveOptions{PruneChildren: true})
	switch {
	case err == nil, cerrdefs.IsNotFound(err):
		return nil
	case cerrdefs.IsConflict(err):
		return fmt.Errorf("%w: cannot remove image %s: %v", ErrInUse, tag, err)
	default:
		return fmt.Errorf("%w: cannot remove image %s: %v", ErrUnavailable, tag, err)
	}
}

// Clean removes berth images no configured agent references (all: every
// berth image), and the records of images already gone. An image a
// container uses is always kept. It returns the removed tags.
func (s *Service) Clean(ctx context.Context, all bool) ([]string, error) {
	images, err := s.ListImages(ctx)
	if err != nil {
		return nil, err
	}
	used, err := s.inUse(ctx)
	if err != nil {
		return nil, err
	}
	building := map[string]bool{}
	s.mu.Lock()
	for tag := range s.builds {
		building[tag] = true
	}
	s.mu.Unlock()
	slices.SortStableFunc(images, func(a, b Image) int { return kindOrder(a.Tag) - kindOrder(b.Tag) })
	var removed []string
	var errs []error
	for _, img := range images {
		_, byID := used[img.ID]
		_, byTag := used[img.Tag]
		switch {
		case building[img.Tag] || img.Status == StatusBuilding:
			continue
		case img.Present && (byID || byTag):
			continue
		case !all && len(img.Agents) > 0:
			continue
		}
		if img.Present {
			if err := s.removeFromEngine(ctx, img.Tag); err != nil {
				if errors.Is(err, ErrInUse) {
					continue // a child image still stands on it
				}
				errs = append(errs, err)
				continue
			}
		}
		if err := s.store.deleteImage(img.Tag); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, img.Tag)
	}
	if len(removed) > 0 {
		s.changed()
		s.log.Info("images cleaned", "removed", strings.Join(removed, " "), "all", all)
	}
	return removed, errors.Join(errs...)
}
