// Command probe is what a hostile tool would run against berth-agent in the
// agent tests: it tries to attach to each thread of a process with ptrace
// and to find a string in its memory through /proc/PID/task/TID/maps and
// .../mem. Each thread counts: Landlock domains are per thread, so the one
// thread that started the tool may be reachable when the others are not.
// It prints what happened and never prints the memory itself; it exits 0
// when it got in.
//
//	probe ptrace PID
//	probe mem PID NEEDLE
package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Println("usage: probe ptrace PID | probe mem PID NEEDLE")
		os.Exit(2)
	}
	pid, err := strconv.Atoi(os.Args[2])
	if err != nil {
		fmt.Println("bad pid:", err)
		os.Exit(2)
	}
	var try func(tid int) bool
	switch {
	case os.Args[1] == "ptrace":
		try = attach
	case os.Args[1] == "mem" && len(os.Args) == 4:
		try = func(tid int) bool { return scan(pid, tid, os.Args[3]) }
	default:
		fmt.Println("unknown probe")
		os.Exit(2)
	}
	tids := []int{pid}
	if entries, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid)); err != nil {
		// Thread ids usually follow the process id: guess them, below
		// the ids of this probe and of the shell that started it.
		fmt.Println("task list refused:", err)
		limit := os.Getpid()
		if pp := os.Getppid(); pp != pid && pp < limit {
			limit = pp
		}
		for tid := pid + 1; tid < limit && tid <= pid+64; tid++ {
			tids = append(tids, tid)
		}
	} else {
		for _, e := range entries {
			if tid, err := strconv.Atoi(e.Name()); err == nil && tid != pid {
				tids = append(tids, tid)
			}
		}
	}
	for _, tid := range tids {
		if try(tid) {
			os.Exit(0)
		}
	}
	os.Exit(1)
}

func attach(tid int) bool {
	if err := syscall.PtraceAttach(tid); err != nil {
		fmt.Printf("ptrace attach to %d refused: %v\n", tid, err)
		return false
	}
	var ws syscall.WaitStatus
	syscall.Wait4(tid, &ws, syscall.WALL, nil)
	syscall.PtraceDetach(tid)
	fmt.Printf("ptrace attach to %d succeeded\n", tid)
	return true
}

// scan reads every readable mapping of thread tid and reports whether needle occurs.
func scan(pid, tid int, needle string) bool {
	dir := fmt.Sprintf("/proc/%d/task/%d", pid, tid)
	maps, err := os.ReadFile(dir + "/maps")
	if err != nil {
		fmt.Println("maps refused:", err)
		return false
	}
	mem, err := os.Open(dir + "/mem")
	if err != nil {
		fmt.Println("mem refused:", err)
		return false
	}
	defer mem.Close()
	read := 0
	lines := bufio.NewScanner(bytes.NewReader(maps))
	for lines.Scan() {
		fields := strings.Fields(lines.Text())
		if len(fields) < 2 || !strings.HasPrefix(fields[1], "r") {
			continue
		}
		bounds := strings.SplitN(fields[0], "-", 2)
		start, err1 := strconv.ParseUint(bounds[0], 16, 64)
		end, err2 := strconv.ParseUint(bounds[1], 16, 64)
		if err1 != nil || err2 != nil || end <= start || end-start > 1<<30 || start > 1<<62 {
			continue
		}
		buf := make([]byte, end-start)
		n, _ := mem.ReadAt(buf, int64(start))
		read += n
		if bytes.Contains(buf[:n], []byte(needle)) {
			fmt.Printf("needle found in the memory of %d\n", tid)
			return true
		}
	}
	fmt.Printf("needle not found in %d bytes of %d\n", read, tid)
	return false
}
