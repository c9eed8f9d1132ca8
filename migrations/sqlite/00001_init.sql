-- Cheetah's first schema, SQLite flavour. JSON fields are TEXT so they come
-- back byte for byte. Times are declared TIMESTAMP: the driver writes them as
-- text and parses them back into time values; the store always passes UTC, so
-- text order is time order. Booleans are stored as 0 and 1.

-- +goose Up
CREATE TABLE commands (
    command_id          TEXT      NOT NULL PRIMARY KEY,
    user_id             TEXT      NOT NULL,
    client_id           TEXT      NOT NULL,
    context_id          TEXT      NOT NULL,
    task_id             TEXT      NOT NULL,
    epoch               INTEGER   NOT NULL,
    name                TEXT      NOT NULL,
    params              TEXT,
    target              TEXT,
    options             TEXT,
    response_mode       TEXT      NOT NULL,
    status              TEXT      NOT NULL,
    status_rank         INTEGER   NOT NULL,
    error_code          TEXT,
    error_message       TEXT,
    error_data          TEXT,
    trace_id            TEXT      NOT NULL,
    callback_url        TEXT,
    created_at          TIMESTAMP NOT NULL,
    dispatched_at       TIMESTAMP,
    acked_at            TIMESTAMP,
    finished_at         TIMESTAMP,
    delivery_attempts   INTEGER   NOT NULL DEFAULT 0,
    delivered           BOOLEAN   NOT NULL DEFAULT 0,
    delivery_last_error TEXT
);

-- A user's command list, newest first, with and without a task filter.
CREATE INDEX commands_user_idx ON commands (user_id, command_id DESC);
CREATE INDEX commands_user_task_idx ON commands (user_id, task_id, command_id DESC);
-- Commands still in flight: what MarkInterrupted looks for at every start.
CREATE INDEX commands_unfinished_idx ON commands (status_rank) WHERE status_rank < 3;
-- History retention deletes by age.
CREATE INDEX commands_created_idx ON commands (created_at);

CREATE TABLE messages (
    command_id TEXT      NOT NULL REFERENCES commands (command_id) ON DELETE CASCADE,
    seq        INTEGER   NOT NULL,
    kind       TEXT      NOT NULL,
    name       TEXT      NOT NULL DEFAULT '',
    data       TEXT,
    code       TEXT      NOT NULL DEFAULT '',
    message    TEXT      NOT NULL DEFAULT '',
    mime       TEXT      NOT NULL DEFAULT '',
    blob       BLOB,
    late       BOOLEAN   NOT NULL DEFAULT 0,
    at         TIMESTAMP NOT NULL,
    PRIMARY KEY (command_id, seq)
);

-- One row holds the highest epoch ever issued, so epochs are never reused
-- across restarts.
CREATE TABLE epochs (
    id         INTEGER NOT NULL PRIMARY KEY CHECK (id = 1),
    high_water INTEGER NOT NULL
);
INSERT INTO epochs (id, high_water) VALUES (1, 0);

CREATE TABLE keys (
    id             TEXT      NOT NULL PRIMARY KEY,
    kind           TEXT      NOT NULL CHECK (kind IN ('client', 'app', 'admin')),
    user_id        TEXT,
    name           TEXT      NOT NULL,
    hash           BLOB      NOT NULL,
    webhook_secret TEXT,
    created_at     TIMESTAMP NOT NULL,
    revoked_at     TIMESTAMP
);

-- +goose Down
DROP TABLE keys;
DROP TABLE epochs;
DROP TABLE messages;
DROP TABLE commands;
