-- The outbox's tables in the store's SQLite file. Times are ms since the Unix epoch (the
-- process clock, as the SQLite store's).
CREATE TABLE IF NOT EXISTS idem_outbox_endpoints (
    name          TEXT    PRIMARY KEY,
    url           TEXT    NOT NULL,
    -- whsec_ secrets, comma separated; the first signs first.
    secrets       TEXT    NOT NULL,
    timeout_ms    INTEGER NOT NULL,
    -- The schedule: its jitter, a semicolon, the delays between attempts in ms, comma separated.
    schedule_ms   TEXT    NOT NULL,
    enabled       INTEGER NOT NULL,
    -- Since when every attempt failed (NULL: the last one succeeded).
    failing_since INTEGER,
    updated_at    INTEGER NOT NULL
);

-- One row per (message, endpoint): the message travels with each of its deliveries.
CREATE TABLE IF NOT EXISTS idem_outbox_deliveries (
    id           INTEGER PRIMARY KEY,
    message_id   TEXT    NOT NULL,
    endpoint     TEXT    NOT NULL,
    payload      BLOB    NOT NULL,
    content_type TEXT    NOT NULL,
    -- The message's own headers, a JSON array of [name, value] pairs.
    headers      TEXT    NOT NULL,
    created_at   INTEGER NOT NULL,
    -- pending, delivered or dead.
    state        TEXT    NOT NULL,
    -- Pending: when it is due; claimed: when the claim runs out.
    next_at      INTEGER NOT NULL,
    attempts     INTEGER NOT NULL,
    -- The claim that may record the running attempt (NULL: not claimed).
    claim_token  TEXT,
    last_status  INTEGER,
    last_error   TEXT,
    finished_at  INTEGER,
    UNIQUE (message_id, endpoint)
);

CREATE INDEX IF NOT EXISTS idem_outbox_deliveries_due
    ON idem_outbox_deliveries (next_at) WHERE state = 'pending';

-- Attempt numbers start again at 1 when an operator retries or replays a delivery.
CREATE TABLE IF NOT EXISTS idem_outbox_attempts (
    id          INTEGER PRIMARY KEY,
    delivery_id INTEGER NOT NULL,
    attempt     INTEGER NOT NULL,
    started_at  INTEGER NOT NULL,
    duration_ms INTEGER NOT NULL,
    status      INTEGER,
    error       TEXT,
    -- The first KiB of the response body.
    response    BLOB
);

CREATE INDEX IF NOT EXISTS idem_outbox_attempts_delivery
    ON idem_outbox_attempts (delivery_id);

CREATE INDEX IF NOT EXISTS idem_outbox_deliveries_finished
    ON idem_outbox_deliveries (state, finished_at) WHERE state <> 'pending';
