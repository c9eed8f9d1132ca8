-- Two columns of a lease's row, both kept when another replica adopts it:
-- clear_state (the context is cleared when the lease begins and when it
-- ends), and generation, which orders the claims of the row: each replica
-- the lease moves to claims it with one more, and a claim takes the row only
-- from a lower generation, so two claims that commit out of order leave the
-- row its later holder's.

-- +goose Up
ALTER TABLE leases ADD COLUMN clear_state boolean NOT NULL DEFAULT false;
ALTER TABLE leases ADD COLUMN generation bigint NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE leases DROP COLUMN generation;
ALTER TABLE leases DROP COLUMN clear_state;
