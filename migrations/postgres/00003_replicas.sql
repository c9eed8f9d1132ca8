-- Several replicas on one database (DESIGN §9). PostgreSQL is the
-- authority: a replica is a member while its row is unexpired; it renews
-- the row every second and stops acting for its clients once it could not
-- renew in time, before any other replica may declare it dead (delete the
-- row) and end its commands as interrupted.
--
-- Every command row names the replica whose registry holds it. The column's
-- default comes from the writing connection's cheetah.replica_id setting
-- (the store sets it when the connection opens), so the hot insert path
-- writes it without carrying it. A broker that is no replica leaves it ''.

-- +goose Up
CREATE TABLE replicas (
    id         text PRIMARY KEY,
    url        text        NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);

-- The secret replicas sign their requests to each other with. The first
-- replica makes it; it never leaves the database but for its replicas.
CREATE TABLE cluster_secret (
    id     integer PRIMARY KEY CHECK (id = 1),
    secret bytea   NOT NULL
);

ALTER TABLE commands ADD COLUMN replica_id text NOT NULL
    DEFAULT COALESCE(current_setting('cheetah.replica_id', true), '');

-- +goose Down
ALTER TABLE commands DROP COLUMN replica_id;
DROP TABLE cluster_secret;
DROP TABLE replicas;
