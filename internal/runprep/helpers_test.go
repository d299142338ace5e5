package runprep

import (
	"io"
	"log/slog"
)

var quietLog = slog.New(slog.NewTextHandler(io.Discard, nil))
