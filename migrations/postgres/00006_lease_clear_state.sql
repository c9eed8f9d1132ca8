-- A lease acquired with clear_state (the context is cleared when it begins
-- and when it ends) keeps asking for it when another replica adopts its row.

-- +goose Up
ALTER TABLE leases ADD COLUMN clear_state boolean NOT NULL DEFAULT false;

-- +goose Down
ALTER TABLE leases DROP COLUMN clear_state;
