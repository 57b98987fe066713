-- The replicas' leases on the global retry budget (src/coord/lease.rs):
-- one row per replica, renewed once per coordination interval. Plain SQL
-- that PostgreSQL, CockroachDB and YugabyteDB all run; safe to apply twice.
CREATE TABLE IF NOT EXISTS retry_budget_replica_leases (
    -- The replica's id (CoordinationConfig.replica_id): unique per process.
    replica_id    TEXT PRIMARY KEY,
    -- Bumped each time a process takes the row, so that a process whose
    -- row was taken by another with the same id learns it.
    epoch         BIGINT NOT NULL,
    -- By the database's clock: now() at the last renewal plus three
    -- intervals. Past it, the others no longer count this replica.
    expires_at    TIMESTAMPTZ NOT NULL,
    -- The rate and burst the replica may hand out, at least what it does.
    granted_rate  DOUBLE PRECISION NOT NULL,
    granted_burst BIGINT NOT NULL,
    -- Its recent demand per tenant: protobuf, src/coord/demand.rs.
    demand        BYTEA NOT NULL
);
