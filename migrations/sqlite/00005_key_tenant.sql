-- Tenant-bound app keys (DESIGN §10), SQLite flavour. See the PostgreSQL
-- file for what the column means.

-- +goose Up
ALTER TABLE keys ADD COLUMN tenant_id TEXT;

-- +goose Down
ALTER TABLE keys DROP COLUMN tenant_id;
