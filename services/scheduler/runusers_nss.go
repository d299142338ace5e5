//go:build cgo && !osusergo

package scheduler

// usersFromFilesOnly: os/user asks NSS, whose sources may be anything.
const usersFromFilesOnly = false
