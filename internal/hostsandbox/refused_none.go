//go:build !386 && !amd64 && !arm && !arm64

package hostsandbox

// There is no filter where go-seccomp-bpf has no syscall table.
var generatedRefused []string
