-- acemq's transactional outbox and inbox on SQLite (acemq-core, feature
-- `outbox`; the columns are documented in acemq_core::outbox). Idempotent:
-- `Outbox::migrate` runs it at every start. Times are Unix milliseconds,
-- written by the application, so that PostgreSQL and SQLite read alike.
CREATE TABLE IF NOT EXISTS acemq_outbox (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    message_id      TEXT    NOT NULL,
    exchange        TEXT    NOT NULL,
    routing_key     TEXT    NOT NULL,
    properties      BLOB    NOT NULL,
    body            BLOB    NOT NULL,
    created_at      INTEGER NOT NULL,
    next_attempt_at INTEGER NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    last_error      TEXT,
    claimed_by      TEXT,
    claimed_until   INTEGER,
    dispatched_at   INTEGER
);
CREATE INDEX IF NOT EXISTS acemq_outbox_waiting
    ON acemq_outbox (next_attempt_at, id) WHERE dispatched_at IS NULL;
CREATE INDEX IF NOT EXISTS acemq_outbox_dispatched
    ON acemq_outbox (dispatched_at) WHERE dispatched_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS acemq_inbox (
    message_id  TEXT   NOT NULL,
    consumer    TEXT   NOT NULL,
    received_at INTEGER NOT NULL,
    PRIMARY KEY (message_id, consumer)
);
CREATE INDEX IF NOT EXISTS acemq_inbox_received ON acemq_inbox (received_at);
