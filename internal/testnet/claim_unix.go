//go:build unix

package testnet

import (
	"os"
	"syscall"
)

// claim takes the lock on path unless another open file holds it, in this
// process or another; the lock goes with the file's close or the process.
func claim(path string) (release func(), ok bool) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return nil, false
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, false
	}
	return func() { f.Close() }, true
}
