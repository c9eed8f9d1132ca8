-- SQLite is single-node: its leases live and die with the one broker, and
-- this table stays empty. It keeps both schemas alike.

-- +goose Up
CREATE TABLE leases (
    token_digest blob    PRIMARY KEY,
    user_id      text    NOT NULL,
    client_id    text    NOT NULL,
    context_id   text    NOT NULL,
    task_id      text    NOT NULL,
    epoch        integer NOT NULL,
    ttl_ms       integer NOT NULL,
    renew_on_use integer NOT NULL,
    expires_at   text    NOT NULL,
    replica_id   text    NOT NULL DEFAULT '',
    orphaned_at  text
);

-- +goose Down
DROP TABLE leases;
