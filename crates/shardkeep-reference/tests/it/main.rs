//! The reference game against real Postgres and Redis: its shard runtime, item transfers, final
//! saves and the core's bookkeeping as the game sees it. Each test gets a fresh database (through
//! `#[sqlx::test]`) and a fresh Redis namespace ([`shardkeep_testkit::TestRedis`]).

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod audit;
mod bookkeeping;
mod crash_window;
mod faultable;
mod final_saves;
mod handoff_fencing;
mod instance_anchor;
mod item_self_pickups;
mod item_transfers;
mod ladder_shard;
mod live_game;
mod live_items;
mod live_outages;
mod live_shard;
mod live_support;
mod live_world;
mod retry_effects;
mod saver_backlog;
mod scene;
mod support;
