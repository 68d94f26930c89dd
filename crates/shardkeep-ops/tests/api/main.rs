//! The operator API over real HTTP, against real Postgres and Redis.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod auth;
mod browser;
mod console;
mod fuzz_requests;
mod operator;
mod routes;
mod security;
mod support;
