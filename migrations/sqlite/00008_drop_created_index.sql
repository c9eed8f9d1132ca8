-- History retention no longer reads commands by created_at: it ranges over
-- the primary key, since command ids are UUIDv7 and grow with time. The
-- index on created_at cost one more index entry written for every admitted
-- command and, on PostgreSQL, for every status change too (each is a new
-- row version, with an entry in every index), on the hot write path, for
-- a query that runs once an hour.

-- +goose Up
DROP INDEX commands_created_idx;

-- +goose Down
CREATE INDEX commands_created_idx ON commands (created_at);
