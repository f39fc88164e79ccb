-- The outbox's tables beside a PostgreSQL store's records. Times are the server's.
CREATE TABLE IF NOT EXISTS idem_outbox_endpoints (
    name          text        PRIMARY KEY,
    url           text        NOT NULL,
    -- whsec_ secrets, comma separated; the first signs first.
    secrets       text        NOT NULL,
    timeout_ms    bigint      NOT NULL,
    -- The schedule: its jitter, a semicolon, the delays between attempts in ms, comma separated.
    schedule_ms   text        NOT NULL,
    enabled       boolean     NOT NULL,
    -- Since when every attempt failed (NULL: the last one succeeded).
    failing_since timestamptz,
    updated_at    timestamptz NOT NULL
);

-- One row per (message, endpoint): the message travels with each of its deliveries.
CREATE TABLE IF NOT EXISTS idem_outbox_deliveries (
    id           bigserial   PRIMARY KEY,
    message_id   text        NOT NULL,
    endpoint     text        NOT NULL,
    payload      bytea       NOT NULL,
    content_type text        NOT NULL,
    -- The message's own headers, a JSON array of [name, value] pairs.
    headers      text        NOT NULL,
    created_at   timestamptz NOT NULL,
    -- pending, delivered or dead.
    state        text        NOT NULL,
    -- When it is due (a claim leaves it as it is).
    next_at      timestamptz NOT NULL,
    attempts     integer     NOT NULL,
    -- The claim that may record the running attempt (NULL: not claimed).
    claim_token  text,
    -- Until when a claim, or a disabled endpoint's setting aside, holds it. No index covers
    -- it, nor the token or the attempts: a claim writes no indexed column, so its update is
    -- HOT (on the same page, no index entry), given the room the fill factor leaves.
    claimed_until timestamptz,
    last_status  integer,
    last_error   text,
    finished_at  timestamptz,
    UNIQUE (message_id, endpoint)
) WITH (fillfactor = 70);

-- A table made before the claim's lease had a column of its own gets it (an ALTER, and its
-- lock, only then). Its fill factor stays as it was: claims are correct either way, only less
-- often HOT.
DO $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM information_schema.columns
        WHERE table_schema = current_schema()
          AND table_name = 'idem_outbox_deliveries'
          AND column_name = 'claimed_until'
    ) THEN
        ALTER TABLE idem_outbox_deliveries ADD COLUMN claimed_until timestamptz;
    END IF;
END
$$;

-- Pending rows by due time: a claim walks it in order, passing over the rows held.
CREATE INDEX IF NOT EXISTS idem_outbox_deliveries_due
    ON idem_outbox_deliveries (next_at) WHERE state = 'pending';

-- Attempt numbers start again at 1 when an operator retries or replays a delivery. Keyed by
-- delivery first: the one index serves a delivery's attempts in order and the purge, so
-- recording an attempt writes one index entry, not two.
CREATE TABLE IF NOT EXISTS idem_outbox_attempts (
    id          bigserial   NOT NULL,
    delivery_id bigint      NOT NULL,
    attempt     integer     NOT NULL,
    started_at  timestamptz NOT NULL,
    duration_ms bigint      NOT NULL,
    status      integer,
    error       text,
    -- The first KiB of the response body.
    response    bytea,
    PRIMARY KEY (delivery_id, id)
);

CREATE INDEX IF NOT EXISTS idem_outbox_deliveries_finished
    ON idem_outbox_deliveries (state, finished_at) WHERE state <> 'pending';
