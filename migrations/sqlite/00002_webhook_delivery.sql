-- Webhook result delivery (DESIGN §5), SQLite flavour. See the PostgreSQL
-- file for what the columns mean. delivery_next_at is stored in UTC like
-- every other time, so text order is time order.

-- +goose Up
ALTER TABLE commands ADD COLUMN callback_key_id TEXT;
ALTER TABLE commands ADD COLUMN delivery_next_at TIMESTAMP;

-- Pending deliveries only: what the webhook worker polls, by due time.
CREATE INDEX commands_delivery_due_idx ON commands (delivery_next_at) WHERE delivery_next_at IS NOT NULL;

-- +goose Down
DROP INDEX commands_delivery_due_idx;
ALTER TABLE commands DROP COLUMN delivery_next_at;
ALTER TABLE commands DROP COLUMN callback_key_id;
