-- Activities: one row each, the whole record (history included) encoded as
-- the store's protobuf record (format byte first, see
-- proto/retrybudget/store/v1/record.proto).
--
-- `version` is the number of events the record holds. Every change of an
-- activity appends an event, so a write that names the version it replaces
-- (`WHERE version = $expected`) fails when another replica moved the
-- activity on first: that is how exactly one decision per attempt is kept
-- across replicas, with no lock held between the read and the write.
CREATE TABLE IF NOT EXISTS retry_budget_activities (
    tenant            TEXT   NOT NULL,
    activity_id       TEXT   NOT NULL,
    version           BIGINT NOT NULL,
    -- From when the record may be purged (before retention is added);
    -- NULL while parked: a person still has to look at it.
    purgeable_from_ms BIGINT,
    record            BYTEA  NOT NULL,
    PRIMARY KEY (tenant, activity_id)
);

-- The retention sweep reads the oldest purgeable records first.
CREATE INDEX IF NOT EXISTS retry_budget_activities_purgeable
    ON retry_budget_activities (purgeable_from_ms);

-- Named leases on background work that one replica at a time should do
-- (the retention sweep). A replica holds one while `expires_at_ms`, by the
-- database's clock, is ahead.
CREATE TABLE IF NOT EXISTS retry_budget_task_leases (
    task          TEXT   PRIMARY KEY,
    holder        TEXT   NOT NULL,
    expires_at_ms BIGINT NOT NULL
);

-- `retry-budget migrate`: how far the copy of each embedded store got, so a
-- copy that stopped resumes after the last activity it committed.
CREATE TABLE IF NOT EXISTS retry_budget_imports (
    source           TEXT   PRIMARY KEY,
    last_tenant      TEXT   NOT NULL,
    last_activity_id TEXT   NOT NULL,
    copied           BIGINT NOT NULL
);
