//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package history

import (
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
)

// lockDatabase takes an exclusive flock on path without waiting, writes
// holder into it, and returns the function that releases it. flock locks
// belong to the open file, so two stores of one process exclude each other
// as two processes do, and the kernel drops the lock when the process dies:
// a crashed broker leaves nothing to clean up. The file stays in place:
// deleting a lock file lets a third process lock a new inode while a second
// still holds the old one.
func lockDatabase(path, holder string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("history.Open: lock file: %w", err)
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if errors.Is(err, syscall.EWOULDBLOCK) {
		b, _ := io.ReadAll(io.LimitReader(f, 4096))
		_ = f.Close()
		return nil, inUse(path, string(b))
	}
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("history.Open: lock %s: %w", path, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(holder+"\n"), 0)
	}
	return func() {
		_ = f.Truncate(0)
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		_ = f.Close()
	}, nil
}
