// Command printversion prints version.String(): the test builds it with and
// without version.LDFlag.
package main

import (
	"fmt"

	"github.com/berth-dev/berth/internal/version"
)

func main() { fmt.Println(version.String()) }
