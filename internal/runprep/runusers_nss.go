//go:build cgo && !osusergo

package runprep

// usersFromFilesOnly: os/user asks NSS, whose sources may be anything.
const usersFromFilesOnly = false
