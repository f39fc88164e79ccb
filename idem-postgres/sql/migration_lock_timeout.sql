-- How long a migration waits for a table lock (ALTER TABLE) before it gives up and tries again:
-- while it waits, every read and write of the table queues behind it, so it never waits long.
SET LOCAL lock_timeout = '100ms'
