-- Webhook result delivery (DESIGN §5). A command sent with a callback keeps
-- what its delivery needs on its own row, so that a pending delivery survives
-- a restart and nothing depends on the broker's memory:
--   callback_key_id   the API key whose webhook secret signs the delivery;
--                     NULL means the broker's own secret (in-process sends).
--   delivery_next_at  when the next attempt is due. The store sets it when a
--                     command with a callback reaches a terminal status; the
--                     webhook worker moves it after each attempt and clears
--                     it once the delivery is delivered or given up.

-- +goose Up
ALTER TABLE commands ADD COLUMN callback_key_id text;
ALTER TABLE commands ADD COLUMN delivery_next_at timestamptz;

-- Pending deliveries only: what the webhook worker polls, by due time.
CREATE INDEX commands_delivery_due_idx ON commands (delivery_next_at) WHERE delivery_next_at IS NOT NULL;

-- +goose Down
DROP INDEX commands_delivery_due_idx;
ALTER TABLE commands DROP COLUMN delivery_next_at;
ALTER TABLE commands DROP COLUMN callback_key_id;
