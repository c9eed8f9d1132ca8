//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package migrations

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"
)

// flockFile takes an exclusive lock on path, creating the file if needed, and
// returns the function that releases it. flock locks belong to the open file,
// so two goroutines of one process exclude each other as two processes do,
// and the kernel drops the lock if the process dies. The file is left in
// place: deleting a lock file lets a third process lock a new inode while a
// second still holds the old one.
func flockFile(ctx context.Context, path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open migration lock: %w", err)
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() {
				_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
				_ = f.Close()
			}, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			_ = f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		// Polling rather than a blocking flock keeps the wait cancellable by
		// ctx; a migration takes milliseconds, so the delay is small.
		select {
		case <-ctx.Done():
			_ = f.Close()
			return nil, fmt.Errorf("wait for migration lock %s: %w", path, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
