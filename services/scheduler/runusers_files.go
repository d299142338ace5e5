//go:build !cgo || osusergo

package scheduler

// usersFromFilesOnly: os/user reads /etc/passwd and /etc/group itself.
const usersFromFilesOnly = true
