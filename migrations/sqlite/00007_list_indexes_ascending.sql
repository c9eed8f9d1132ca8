-- A user's command list, with and without a task filter, indexed in id
-- order instead of newest first. Command ids are UUIDv7 and grow with
-- time, so in descending order every new command went in at the front of
-- its user's (or task's) range, where a full leaf is split or, on SQLite,
-- rebalanced with its siblings and their parent: about one page more
-- written per command. In ascending order a new id goes at the end of its
-- range. The list reads the index backwards, as fast as forwards, on both
-- stores.

-- +goose Up
DROP INDEX commands_user_idx;
DROP INDEX commands_user_task_idx;
CREATE INDEX commands_user_idx ON commands (user_id, command_id);
CREATE INDEX commands_user_task_idx ON commands (user_id, task_id, command_id);

-- +goose Down
DROP INDEX commands_user_idx;
DROP INDEX commands_user_task_idx;
CREATE INDEX commands_user_idx ON commands (user_id, command_id DESC);
CREATE INDEX commands_user_task_idx ON commands (user_id, task_id, command_id DESC);
