// A Go program that stops at a known point for tests/eim/stack:
// main.main -> main.outer -> main.inner -> syscall.Read on a pipe nobody
// writes (a raw blocking fd, so the thread itself sits in read(2), not
// the network poller). It prints "ready go" right before it blocks.
//
// Built by the test with Debian's `go build` (no cgo).
package main

import (
	"os"
	"runtime"
	"syscall"
)

// released is never set: the loop could end, so the frames stay.
var released bool

//go:noinline
func inner(fd int) int {
	buf := make([]byte, 1)
	os.Stdout.WriteString("ready go\n")
	n := 0
	for !released {
		r, err := syscall.Read(fd, buf)
		if err != nil && err != syscall.EINTR {
			os.Exit(4)
		}
		n += r
	}
	return n
}

//go:noinline
func outer(fd int) int {
	return inner(fd) + 1
}

func main() {
	// One thread runs the chain, for its whole life.
	runtime.LockOSThread()
	var fds [2]int
	if err := syscall.Pipe(fds[:]); err != nil {
		os.Exit(5)
	}
	os.Exit(outer(fds[0]) & 1)
}
