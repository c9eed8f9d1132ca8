package main

import (
	"context"
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/cheetahbroker/cheetah/history"
)

type migrateCmd struct {
	DatabaseURL string `name:"database-url" help:"postgres://… for PostgreSQL; empty for the embedded SQLite file in --data-dir."`
	DataDir     string `default:"./cheetah-data" help:"Folder of the embedded SQLite store."`
	Status      bool   `help:"Only print which migrations are applied."`
}

// Run applies every migration under the migration lock (unless --status)
// and prints each version with whether it is applied.
func (c *migrateCmd) Run() error {
	ctx := context.Background()
	cfg := history.Config{DatabaseURL: c.DatabaseURL, DataDir: c.DataDir}
	run := history.Migrate
	if c.Status {
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
