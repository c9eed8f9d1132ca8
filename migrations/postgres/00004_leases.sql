-- Leases outlive the replica that made them (DESIGN §9). A replica writes
-- a row when it grants a lease, moves its expiry forward now and then as
-- it is renewed or used, and deletes it when the lease ends; a lease that
-- moves to another replica with its client is rewritten there. When a
-- replica dies, the survivors mark its rows orphaned; the replica its
-- client reconnects to adopts them within the reconnect grace, with the
-- same token digest, task and epoch, and the rest are deleted.
--
-- replica_id comes from the writing connection's cheetah.replica_id
-- setting, as on commands.

-- +goose Up
CREATE TABLE leases (
    token_digest bytea       PRIMARY KEY,
    user_id      text        NOT NULL,
    client_id    text        NOT NULL,
    context_id   text        NOT NULL,
    task_id      text        NOT NULL,
    epoch        bigint      NOT NULL,
    ttl_ms       bigint      NOT NULL,
    renew_on_use boolean     NOT NULL,
    expires_at   timestamptz NOT NULL,
    replica_id   text        NOT NULL DEFAULT COALESCE(current_setting('cheetah.replica_id', true), ''),
    orphaned_at  timestamptz
);
CREATE INDEX leases_client_idx ON leases (user_id, client_id);
CREATE INDEX leases_replica_idx ON leases (replica_id);

-- +goose Down
DROP TABLE leases;
