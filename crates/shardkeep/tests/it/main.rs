//! Integration tests against real Postgres and Redis. Each test gets a fresh database (through
//! `#[sqlx::test]`) and a fresh Redis namespace ([`shardkeep_testkit::TestRedis`]).

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod character_drivers;
mod checkpoint_drivers;
mod checkpoint_keys;
mod claims_together;
mod coord_cleanup;
mod coord_handoff;
mod coord_records;
mod coord_session_order;
mod corrupt_fences;
mod crash_chains;
mod fuzz_checkpoints;
mod fuzz_decoders;
mod journal;
mod journal_order;
mod ladder_store;
mod launch;
mod live_cadence;
mod live_logins;
mod live_pickups;
mod live_records;
mod live_runtime;
mod live_stops;
mod live_tick;
mod lock_order;
mod migrate;
mod pending_at_claim;
mod pg_pooler;
mod placement_records;
mod queue;
mod queue_depths;
mod queue_identity;
mod queue_order;
mod redis_topology;
mod retry_connections;
mod retry_enqueue;
mod retry_jobs;
mod retry_lease_expiry;
mod retry_plans;
mod retry_worker_loop;
mod schema_keys;
mod schema_rollout;
mod schema_versions;
mod services;
mod settle_bound;
mod transfer_markers;
mod transit;
