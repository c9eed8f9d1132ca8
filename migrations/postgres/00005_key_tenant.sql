-- Tenant-bound app keys (DESIGN §10): an app key made with a tenant_id acts
-- only for that tenant, and its acquires count there under the quota
-- funnel. NULL for every other key.

-- +goose Up
ALTER TABLE keys ADD COLUMN tenant_id text;

-- +goose Down
ALTER TABLE keys DROP COLUMN tenant_id;
