// Command sysprobe is what a hostile tool runs in the sandbox tests: it
// tries one thing that crosses from one run to another or to the host and
// prints one line saying how that went ("... ok" or "... refused: <errno>").
//
//	sysprobe connect PATH           connect to a named Unix socket
//	sysprobe dbus PATH              say Hello on a D-Bus socket and list names
//	sysprobe msgget KEY create|find make or look up a SysV message queue
//	sysprobe addkey user|session|process
//	                                add a key to a kernel keyring
//	sysprobe userns                 start a child in a user namespace
//	sysprobe caps                   print its effective and permitted capabilities
package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"

	"github.com/godbus/dbus/v5"
	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Println("usage: sysprobe connect|dbus|msgget|addkey|userns|caps ...")
		os.Exit(2)
	}
	arg := func(i int) string {
		if len(os.Args) <= i {
			fmt.Println(os.Args[1], "needs more arguments")
			os.Exit(2)
		}
		return os.Args[i]
	}
	what := os.Args[1]
	var err error
	switch what {
	case "connect":
		what += " " + arg(2)
		var c net.Conn
		if c, err = net.Dial("unix", arg(2)); err == nil {
			c.Close()
		}
	case "dbus":
		what += " " + arg(2)
		var conn *dbus.Conn
		if conn, err = dbus.Connect("unix:path=" + arg(2)); err == nil {
			var names []string
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err = conn.BusObject().CallWithContext(ctx, "org.freedesktop.DBus.ListNames", 0).Store(&names)
			cancel()
			conn.Close()
			if err == nil {
				what += fmt.Sprintf(" (%d names)", len(names))
			}
		}
	case "msgget":
		what += " " + arg(2) + " " + arg(3)
		key, perr := strconv.ParseInt(arg(2), 0, 32)
		if perr != nil {
			fmt.Println("bad key:", perr)
			os.Exit(2)
		}
		flags := uintptr(0)
		if arg(3) == "create" {
			flags = unix.IPC_CREAT | unix.IPC_EXCL | 0o666
		}
		_, _, e := unix.Syscall(unix.SYS_MSGGET, uintptr(key), flags, 0)
		if e != 0 {
			err = e
		}
	case "addkey":
		what += " " + arg(2)
		ring := map[string]int{"user": unix.KEY_SPEC_USER_KEYRING, "session": unix.KEY_SPEC_SESSION_KEYRING, "process": unix.KEY_SPEC_PROCESS_KEYRING}[arg(2)]
		if ring == 0 {
			fmt.Println("unknown keyring", arg(2))
			os.Exit(2)
		}
		var id int
		if id, err = unix.AddKey("user", "berth-sysprobe", []byte("left for another agent"), ring); err == nil {
			// Leave nothing behind on the host for the next test.
			_, _ = unix.KeyctlInt(unix.KEYCTL_REVOKE, id, 0, 0, 0)
		}
	case "userns":
		// A child in a user namespace of its own (clone with CLONE_NEWUSER).
		cmd := exec.Command("/bin/true")
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER}
		err = cmd.Run()
	case "caps":
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err = unix.Capget(&hdr, &data[0]); err == nil {
			what += fmt.Sprintf(" effective=%x permitted=%x", uint64(data[1].Effective)<<32|uint64(data[0].Effective), uint64(data[1].Permitted)<<32|uint64(data[0].Permitted))
		}
	default:
		fmt.Println("unknown probe", what)
		os.Exit(2)
	}
	if err != nil {
		fmt.Printf("%s refused: %v\n", what, err)
		return
	}
	fmt.Printf("%s ok\n", what)
}
