package main

import (
	"errors"
	"os"
	"strconv"
	"syscall"
	"unsafe"
)

// pinProcess restricts every thread of process pid to one CPU. Threads
// started later inherit the mask of the thread that starts them, so once
// every existing thread is pinned the whole process stays pinned; the loop
// catches threads started while it runs.
func pinProcess(pid, cpu int) error {
	var mask [16]uint64 // 1024 CPUs
	if cpu < 0 || cpu >= 64*len(mask) {
		return errors.New("cpu out of range")
	}
	mask[cpu/64] = 1 << (cpu % 64)
	done := map[int]bool{}
	for {
		entries, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
		if err != nil {
			return err
		}
		fresh := 0
		for _, e := range entries {
			tid, err := strconv.Atoi(e.Name())
			if err != nil || done[tid] {
				continue
			}
			_, _, errno := syscall.RawSyscall(syscall.SYS_SCHED_SETAFFINITY,
				uintptr(tid), unsafe.Sizeof(mask), uintptr(unsafe.Pointer(&mask[0])))
			if errno != 0 && errno != syscall.ESRCH {
				return errno
			}
			done[tid] = true
			fresh++
		}
		if fresh == 0 {
			return nil
		}
	}
}

// allowedCPUs returns the CPUs this process may run on, lowest first.
func allowedCPUs() ([]int, error) {
	var mask [16]uint64
	_, _, errno := syscall.RawSyscall(syscall.SYS_SCHED_GETAFFINITY,
		0, unsafe.Sizeof(mask), uintptr(unsafe.Pointer(&mask[0])))
	if errno != 0 {
		return nil, errno
	}
	var cpus []int
	for w, bits := range mask {
		for b := range 64 {
			if bits&(1<<b) != 0 {
				cpus = append(cpus, 64*w+b)
			}
		}
	}
	return cpus, nil
}
