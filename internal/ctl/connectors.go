package ctl

import (
	"cmp"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/berth-dev/berth/internal/busapi"
)

// writeConnectors prints dev.berth.Intake1's Connectors property for
// `berthctl status`: one line per connector, and its last error and warning
// below it when it has them.
func writeConnectors(w io.Writer, list []busapi.ConnectorStatus) error {
	if len(list) == 0 {
		fmt.Fprintln(w, "connectors: none configured")
		return nil
	}
	fmt.Fprintln(w, "connectors:")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  ID\tTYPE\tSTATE\tCONNECTED SINCE\tLAST EVENT\tRECONNECTS\tPROGRESS\tREACTIONS")
	var notes []string
	for _, c := range list {
		id := c.ID
		reactions := cmp.Or(c.Reactions, "-")
		if strings.HasPrefix(reactions, "refused") {
			notes = append(notes, fmt.Sprintf("  %s: WARNING: reactions %s (grant it, or set reactions = false)", id, oneLine(reactions)))
			reactions = "refused"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", id, c.Type, c.State,
			cmp.Or(c.ConnectedSince, "-"), cmp.Or(c.LastEvent, "-"), c.Reconnects,
			cmp.Or(c.Progress, "-"), reactions)
		if e := c.LastError; e != "" {
			if at := c.LastErrorAt; at != "" {
				notes = append(notes, fmt.Sprintf("  %s: last error at %s: %s", id, at, oneLine(e)))
			} else {
				notes = append(notes, fmt.Sprintf("  %s: last error: %s", id, oneLine(e)))
			}
		}
		if warn := c.Warning; warn != "" {
			notes = append(notes, fmt.Sprintf("  %s: WARNING: %s", id, oneLine(warn)))
		}
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("cannot print connectors: %w", err)
	}
	for _, n := range notes {
		fmt.Fprintln(w, n)
	}
	return nil
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
