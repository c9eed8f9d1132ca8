-- A lease row's clear_state and claim generation, SQLite flavour (the
-- schemas stay alike; lease rows are written only among replicas on
-- PostgreSQL). See the PostgreSQL file for what the columns mean.

-- +goose Up
ALTER TABLE leases ADD COLUMN clear_state INTEGER NOT NULL DEFAULT 0;
ALTER TABLE leases ADD COLUMN generation INTEGER NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE leases DROP COLUMN generation;
ALTER TABLE leases DROP COLUMN clear_state;
