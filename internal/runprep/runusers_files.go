//go:build !cgo || osusergo

package runprep

// usersFromFilesOnly: os/user reads /etc/passwd and /etc/group itself.
const usersFromFilesOnly = true
