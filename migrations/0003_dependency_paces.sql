-- Each dependency's pace (src/store.rs, Store::save_paces): what the
-- replicas' evidence of its health said, saved once a second so that a
-- restart finds it where it stood. One row per dependency, the last writer
-- wins. Plain SQL that PostgreSQL, CockroachDB and YugabyteDB all run; safe
-- to apply twice.
CREATE TABLE IF NOT EXISTS retry_budget_dependency_paces (
    dependency TEXT PRIMARY KEY,
    -- protobuf retrybudget.store.v1.DependencyPace (proto/retrybudget/store).
    pace       BYTEA NOT NULL,
    -- When it was saved, unix milliseconds (the saving replica's clock).
    saved_at   BIGINT NOT NULL
);
