-- SQLite is single-node (DESIGN §9): its commands all belong to the one
-- broker that holds the data directory. The column keeps both schemas alike.

-- +goose Up
ALTER TABLE commands ADD COLUMN replica_id text NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE commands DROP COLUMN replica_id;
