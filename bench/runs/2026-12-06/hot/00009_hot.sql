-- +goose Up
DROP INDEX commands_unfinished_idx;
ALTER TABLE commands SET (fillfactor = 90);

-- +goose Down
CREATE INDEX commands_unfinished_idx ON commands (status_rank) WHERE status_rank < 3;
