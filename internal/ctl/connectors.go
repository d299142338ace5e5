package ctl

import (
	"cmp"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/godbus/dbus/v5"
)

// writeConnectors prints dev.berth.Intake1's Connectors property (aa{sv},
// as GetAll returns it) for `berthctl status`: one line per connector, and
// its last error and warning below it when it has them.
func writeConnectors(w io.Writer, v dbus.Variant) error {
	list, ok := v.Value().([]map[string]dbus.Variant)
	if !ok {
		return fmt.Errorf("cannot read connectors: property is %s, want aa{sv}", v.Signature())
	}
	if len(list) == 0 {
		fmt.Fprintln(w, "connectors: none configured")
		return nil
	}
	str := func(m map[string]dbus.Variant, k string) string {
		s, _ := m[k].Value().(string)
		return s
	}
	fmt.Fprintln(w, "connectors:")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  ID\tTYPE\tSTATE\tCONNECTED SINCE\tLAST EVENT\tRECONNECTS")
	var notes []string
	for _, c := range list {
		reconnects, _ := c["reconnects"].Value().(uint32)
		id := str(c, "id")
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%d\n", id, str(c, "type"), str(c, "state"),
			cmp.Or(str(c, "connected_since"), "-"), cmp.Or(str(c, "last_event"), "-"), reconnects)
		if e := str(c, "last_error"); e != "" {
			if at := str(c, "last_error_at"); at != "" {
				notes = append(notes, fmt.Sprintf("  %s: last error at %s: %s", id, at, oneLine(e)))
			} else {
				notes = append(notes, fmt.Sprintf("  %s: last error: %s", id, oneLine(e)))
			}
		}
		if warn := str(c, "warning"); warn != "" {
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
