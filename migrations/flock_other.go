//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package migrations

import "context"

// flockFile is a no-op where the system has no flock: SQLite migrations are
// then only safe with one process per database file.
func flockFile(ctx context.Context, path string) (unlock func(), err error) {
	return func() {}, nil
}
