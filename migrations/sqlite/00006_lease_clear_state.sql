-- A lease's clear_state, SQLite flavour (the schemas stay alike; lease
-- rows are written only among replicas on PostgreSQL). See the PostgreSQL
-- file for what the column means.

-- +goose Up
ALTER TABLE leases ADD COLUMN clear_state INTEGER NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE leases DROP COLUMN clear_state;
