package main

import (
	"context"
	"fmt"

	"github.com/cheetahbroker/cheetah/history"
)

type migrateCmd struct {
	DatabaseURL string `name:"database-url" help:"postgres://… for PostgreSQL; empty for the embedded SQLite file in --data-dir."`
	DataDir     string `default:"./cheetah-data" help:"Folder of the embedded SQLite store."`
}

// Run applies every migration (Open does, under a lock) and says so.
func (c *migrateCmd) Run() error {
	store, err := history.Open(context.Background(), history.Config{DatabaseURL: c.DatabaseURL, DataDir: c.DataDir})
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	defer store.Close()
	fmt.Printf("migrations applied (%s)\n", store.Dialect())
	return nil
}
