//! The reference game against real Postgres and Redis (and the embedded file): its shard on the
//! live-copy runtime, item transfers, store outages, loads and the core's bookkeeping as the
//! game sees it. Each test gets a fresh database (through
//! `#[sqlx::test]`) and a fresh Redis namespace ([`shardkeep_testkit::TestRedis`]).

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod audit;
mod bookkeeping;
mod faultable;
mod item_transfers;
mod live_game;
mod live_items;
mod live_outages;
mod live_shard;
mod live_support;
mod live_world;
mod loads;
mod retry_effects;
mod scene;
mod support;
