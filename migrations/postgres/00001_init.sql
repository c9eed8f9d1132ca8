-- Cheetah's first schema. JSON fields are text, not jsonb, so the JSON a
-- caller sent comes back byte for byte (jsonb would reorder keys and drop
-- whitespace). Command ids use the "C" collation so that text order is byte
-- order: UUIDv7 strings then sort by time whatever the database's locale.

-- +goose Up
CREATE TABLE commands (
    command_id          text COLLATE "C" PRIMARY KEY,
    user_id             text        NOT NULL,
    client_id           text        NOT NULL,
    context_id          text        NOT NULL,
    task_id             text        NOT NULL,
    epoch               bigint      NOT NULL,
    name                text        NOT NULL,
    params              text,
    target              text,
    options             text,
    response_mode       text        NOT NULL,
    status              text        NOT NULL,
    status_rank         smallint    NOT NULL,
    error_code          text,
    error_message       text,
    error_data          text,
    trace_id            text        NOT NULL,
    callback_url        text,
    created_at          timestamptz NOT NULL,
    dispatched_at       timestamptz,
    acked_at            timestamptz,
    finished_at         timestamptz,
    delivery_attempts   integer     NOT NULL DEFAULT 0,
    delivered           boolean     NOT NULL DEFAULT false,
    delivery_last_error text
);

-- A user's command list, newest first, with and without a task filter.
CREATE INDEX commands_user_idx ON commands (user_id, command_id DESC);
CREATE INDEX commands_user_task_idx ON commands (user_id, task_id, command_id DESC);
-- Commands still in flight: what MarkInterrupted looks for at every start.
CREATE INDEX commands_unfinished_idx ON commands (status_rank) WHERE status_rank < 3;
-- History retention deletes by age.
CREATE INDEX commands_created_idx ON commands (created_at);

CREATE TABLE messages (
    command_id text COLLATE "C" NOT NULL REFERENCES commands (command_id) ON DELETE CASCADE,
    seq        bigint      NOT NULL,
    kind       text        NOT NULL,
    name       text        NOT NULL DEFAULT '',
    data       text,
    code       text        NOT NULL DEFAULT '',
    message    text        NOT NULL DEFAULT '',
    mime       text        NOT NULL DEFAULT '',
    blob       bytea,
    late       boolean     NOT NULL DEFAULT false,
    at         timestamptz NOT NULL,
    PRIMARY KEY (command_id, seq)
);

-- One row holds the highest epoch ever issued, so epochs are never reused
-- across restarts.
CREATE TABLE epochs (
    id         integer PRIMARY KEY CHECK (id = 1),
    high_water bigint  NOT NULL
);
INSERT INTO epochs (id, high_water) VALUES (1, 0);

CREATE TABLE keys (
    id             text PRIMARY KEY,
    kind           text        NOT NULL CHECK (kind IN ('client', 'app', 'admin')),
    user_id        text,
    name           text        NOT NULL,
    hash           bytea       NOT NULL,
    webhook_secret text,
    created_at     timestamptz NOT NULL,
    revoked_at     timestamptz
);

-- +goose Down
DROP TABLE keys;
DROP TABLE epochs;
DROP TABLE messages;
DROP TABLE commands;
