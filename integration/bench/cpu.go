package main

import (
	"bytes"
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTick is the unit of /proc CPU times (USER_HZ, 100 on Linux).
const clockTick = 10 * time.Millisecond

// cpuSample is a reading of the CPU time used so far by the machine and by
// each process of the benchmark.
type cpuSample struct {
	machine time.Duration // user + nice + system + steal, all CPUs
	procs   map[int]time.Duration
}

// sampleCPU reads /proc; unreadable entries read as zero.
func sampleCPU(pids []int) cpuSample {
	s := cpuSample{procs: make(map[int]time.Duration, len(pids))}
	if data, err := os.ReadFile("/proc/stat"); err == nil {
		line, _, _ := bytes.Cut(data, []byte("\n"))
		f := strings.Fields(string(line))
		// cpu user nice system idle iowait irq softirq steal ...
		for _, i := range []int{1, 2, 3, 8} {
			if i < len(f) {
				s.machine += ticks(f[i])
			}
		}
	}
	for _, pid := range pids {
		s.procs[pid] = procCPU(pid)
	}
	return s
}

// procCPU is the user + system time of all threads of a process.
func procCPU(pid int) time.Duration {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// The command name, in parentheses, may hold spaces: fields count from
	// after its closing parenthesis, where field 3 (state) is the first.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 13 {
		return 0
	}
	return ticks(f[11]) + ticks(f[12]) // utime (14), stime (15)
}

func ticks(s string) time.Duration {
	n, _ := strconv.ParseInt(s, 10, 64)
	return time.Duration(n) * clockTick
}

// cpuUse is the CPU time spent between two samples.
type cpuUse struct {
	caddy   time.Duration // the Caddy under load
	self    time.Duration // the load generator
	others  time.Duration // the benchmark's other processes (upstream, idle Caddy)
	foreign time.Duration // processes that are not part of the benchmark
	wall    time.Duration
	byPID   map[int]time.Duration // each of the benchmark's processes
}

// cores is CPU time over wall time.
func cores(d, wall time.Duration) float64 {
	if wall <= 0 {
		return 0
	}
	return float64(d) / float64(wall)
}

func cpuBetween(a, b cpuSample, caddyPID int, wall time.Duration) cpuUse {
	u := cpuUse{wall: wall, foreign: b.machine - a.machine, byPID: make(map[int]time.Duration, len(b.procs))}
	for pid, t := range b.procs {
		d := t - a.procs[pid]
		u.byPID[pid] = d
		u.foreign -= d
		switch pid {
		case caddyPID:
			u.caddy = d
		case os.Getpid():
			u.self = d
		default:
			u.others += d
		}
	}
	u.foreign = max(u.foreign, 0)
	return u
}
