package history

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// ErrDataDirInUse is returned by Open when another store (another broker)
// holds the SQLite database's lock file: SQLite is single-node, and a second
// broker on one database would mark the first one's commands interrupted.
var ErrDataDirInUse = errors.New("history: the database is in use by another broker")

// lockFileFor returns the lock file that keeps a SQLite database to one
// store: "<file>.lock" beside it (cheetah.db.lock in the data directory).
func lockFileFor(dbFile string) string { return dbFile + ".lock" }

// holderInfo is what a store writes into its lock file for a second one to
// show: this process's pid, host and holder description.
func holderInfo(holder string) string {
	host, _ := os.Hostname()
	var b strings.Builder
	b.WriteString("pid " + strconv.Itoa(os.Getpid()))
	if host != "" {
		b.WriteString(" on host " + host)
	}
	if holder != "" {
		b.WriteString(", " + holder)
	}
	b.WriteString(", since " + time.Now().UTC().Format(time.RFC3339))
	return b.String()
}

// inUse is the error a store refused by the lock returns, naming who holds
// it as its lock file says.
func inUse(path, content string) error {
	content = strings.TrimSpace(content)
	if content == "" {
		content = "a process that has not written its details yet"
	}
	return fmt.Errorf("history.Open: %w (%s; lock file %s): stop it, or give this broker another data directory",
		ErrDataDirInUse, content, path)
}
