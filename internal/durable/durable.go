// Package durable holds what berth's writes to disk share to survive a
// crash: a file or a renamed entry is on disk only once its directory is
// synced too.
package durable

import (
	"fmt"
	"os"
)

// SyncDir fsyncs the directory dir, so that entries created or renamed in
// it survive a crash.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("cannot sync %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("cannot sync %s: %w", dir, err)
	}
	return nil
}
