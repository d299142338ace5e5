package egress

import (
	"fmt"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// LoopbackUp brings the network namespace's loopback up when it is down, so
// the proxy can listen on 127.0.0.1; raised says it had to. systemd's
// PrivateNetwork, Docker's network=none and a root scheduler's namespace
// bring it up themselves; an agent in a user namespace of its own (a
// scheduler that is neither root nor under systemd) finds it down and
// needs CAP_NET_ADMIN in that namespace to raise it.
func LoopbackUp() (raised bool, err error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return false, fmt.Errorf("cannot bring up the sandbox's loopback: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return false, fmt.Errorf("cannot bring up the sandbox's loopback: %w", err)
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return false, fmt.Errorf("cannot bring up the sandbox's loopback: %w", err)
	}
	if ifr.Uint16()&unix.IFF_UP != 0 {
		return false, nil
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return false, fmt.Errorf("cannot bring up the sandbox's loopback (the agent needs CAP_NET_ADMIN in its own network namespace for that): %w", err)
	}
	return true, nil
}

// DropCapabilities clears every capability of every thread of an agent
// that is not root: the one that brought the loopback up must not reach the
// tools (ambient capabilities survive execve). Root agents keep theirs, and
// an agent that holds none (a root scheduler's run: its switch to the run's
// uid cleared them) skips the two passes over every thread.
func DropCapabilities() error {
	if os.Geteuid() == 0 || !holdsCapabilities() {
		return nil
	}
	if _, _, e := syscall.AllThreadsSyscall6(syscall.SYS_PRCTL, unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0, 0); e != 0 {
		return fmt.Errorf("cannot clear ambient capabilities: %w", e)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if _, _, e := syscall.AllThreadsSyscall(syscall.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); e != 0 {
		return fmt.Errorf("cannot drop capabilities: %w", e)
	}
	return nil
}

// holdsCapabilities reports whether the calling thread holds any capability
// (effective, permitted or inheritable; ambient ones are in both of the
// latter), and true when it cannot tell. One thread speaks for all:
// berth-agent changes capabilities only on every thread at once.
func holdsCapabilities() bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return true
	}
	for _, d := range data {
		if d.Effective|d.Permitted|d.Inheritable != 0 {
			return true
		}
	}
	return false
}
