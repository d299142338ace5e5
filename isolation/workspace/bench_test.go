package workspace_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/berth-dev/berth/isolation/workspace"
)

// BenchmarkEnsure is what a new agent's first run pays for its default
// 1 GiB quota (a fresh image, made and mounted), and every later run (it is
// mounted already).
func BenchmarkEnsure(b *testing.B) {
	for _, fresh := range []bool{true, false} {
		b.Run(fmt.Sprintf("fresh=%v", fresh), func(b *testing.B) {
			o := setup(b)
			o.Bytes = 1 << 30
			if !fresh {
				if err := workspace.Ensure(context.Background(), o); err != nil {
					b.Fatal(err)
				}
			}
			dir, image := o.Dir, o.Image
			b.ResetTimer()
			for i := range b.N {
				if fresh {
					o.Dir, o.Image = filepath.Join(dir, fmt.Sprint(i)), filepath.Join(filepath.Dir(image), fmt.Sprintf("%d.img", i))
				}
				if err := workspace.Ensure(context.Background(), o); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
