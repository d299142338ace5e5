package daemon

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/berth-dev/berth/internal/config"
)

// LoadConfig loads the config at path. With a logger, each problem is logged
// on its own line whose text names file, line and key ("config refused:
// /etc/berth/berth.d/10-x.toml:7: agents[0].container_mode.network: must be
// ..."), since plain journalctl and systemctl status show only the text.
func LoadConfig(path string, log *slog.Logger) (*config.Config, error) {
	cfg, err := config.Load(path)
	if err != nil {
		err = fmt.Errorf("cannot load config %s: %w", path, err)
		if log != nil {
			logRefused(log, "config refused: ", err)
		}
		return nil, err
	}
	return cfg, nil
}

// logRefused logs a refused configuration: one line per problem, its text
// prefix followed by file:line: key: what is wrong, and the same as fields.
// It returns the first problem's text, for STATUS=.
func logRefused(log *slog.Logger, prefix string, err error) string {
	var errs config.Errors
	var one *config.Error
	if !errors.As(err, &errs) && errors.As(err, &one) {
		errs = config.Errors{one}
	}
	if len(errs) == 0 {
		log.Error(prefix+err.Error(), "err", err)
		return err.Error()
	}
	for _, e := range errs {
		log.Error(prefix+e.Error(), "file", e.File, "line", e.Line, "key", e.Key, "err", e.Msg)
	}
	first := errs[0].Error()
	if len(errs) > 1 {
		first += fmt.Sprintf(" (and %d more)", len(errs)-1)
	}
	return first
}
