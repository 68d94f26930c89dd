//! The append-only audit trail: what permanently happens to characters and accounts.
//!
//! - [`event`] — events and their dedup keys (pure).
//! - [`store`] — idempotent inserts and newest-first reads, in Postgres or (`store_sqlite`)
//!   the embedded store's file.
//! - [`auditor`] — the asynchronous, batched shard-side sink.
//! - [`accounts`] — account operations written with their audit rows in one transaction.
//! - [`read`] — the self view and the staff view.

pub mod accounts;
pub mod auditor;
pub mod event;
pub mod read;
pub mod store;
pub(crate) mod store_sqlite;

pub use accounts::{AccountStore, Tier};
pub use auditor::{Auditor, AuditorConfig, AuditorStats};
pub use event::{AuditEvent, EventKind, SubjectType};
pub use read::{AuditReadError, AuditReader, StaffReadLimit, Viewer};
pub use store::{AuditCursor, AuditPage, AuditRow, AuditStore};
pub use store_sqlite::name_key;
