package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/cheetahbroker/cheetah/history"
)

type migrateCmd struct {
	DatabaseURL string `name:"database-url" help:"postgres://… for PostgreSQL; empty for the embedded SQLite file in --data-dir."`
	DataDir     string `default:"./cheetah-data" help:"Folder of the embedded SQLite store."`
	Status      bool   `help:"Only print which migrations are applied; changes nothing, and creates no store."`
}

// sqliteFile is the SQLite file the flags name, or "" for PostgreSQL (or a
// URL the store refuses, which it then reports). It mirrors the store's own
// reading of --database-url.
func (c *migrateCmd) sqliteFile() string {
	u := c.DatabaseURL
	var path string
	switch {
	case u == "":
		dir := c.DataDir
		if dir == "" {
			dir = "."
		}
		return filepath.Join(dir, "cheetah.db")
	case strings.HasPrefix(u, "sqlite://"):
		path = strings.TrimPrefix(u, "sqlite://")
	case strings.HasPrefix(u, "file:"):
		path = strings.TrimPrefix(u, "file:")
	default:
		return ""
	}
	path, _, _ = strings.Cut(path, "?")
	if path == ":memory:" {
		return ""
	}
	return path
}

// Run applies every migration under the migration lock (unless --status)
// and prints each version with whether it is applied.
func (c *migrateCmd) Run() error {
	ctx := context.Background()
	cfg := history.Config{DatabaseURL: c.DatabaseURL, DataDir: c.DataDir}
	run := history.Migrate
	if c.Status {
		// Opening a SQLite store creates its folder and file: a status
		// query on one that does not exist says so instead.
		if f := c.sqliteFile(); f != "" {
			if _, err := os.Stat(f); errors.Is(err, fs.ErrNotExist) {
				return exitErr(exitNotFound, fmt.Errorf("migrate --status: no store at %s: nothing is applied (`cheetah migrate` creates it)", f))
			}
		}
		run = history.MigrationStatus
	}
	versions, err := run(ctx, cfg)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "VERSION\tNAME\tAPPLIED")
	for _, v := range versions {
		fmt.Fprintf(w, "%d\t%s\t%v\n", v.Version, v.Name, v.Applied)
	}
	return w.Flush()
}
