package main

// int80 makes a 32-bit syscall (int 0x80, the i386 table) and returns what
// the kernel put in AX: the result, or minus an errno.
func int80(trap uintptr) uintptr

// i386Getpid is getpid's number in the i386 table.
const i386Getpid = 20

// foreignGetpid is getpid through the i386 table; ok is false where there is
// no such table on this architecture.
func foreignGetpid() (ret int64, ok bool) { return int64(int80(i386Getpid)), true }
