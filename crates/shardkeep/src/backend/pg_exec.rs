//! How statements reach Postgres: straight, or through a pooler in transaction mode.
//!
//! A pooler such as PgBouncer in transaction mode lends a server connection to a client for one
//! transaction only. sqlx prepares every statement with its own round trip (Parse and a Sync)
//! before it binds and runs it (Bind, Execute and a second Sync), and names the statements it
//! prepares. Outside a transaction the pooler may hand the second half to another server — one
//! that never saw the statement, or that holds another client's statement of the same name. So
//! through such a pooler shardkeep sends every statement inside a transaction (the server stays
//! lent until it ends), keeps no statement cache, and starts each transaction by dropping the
//! prepared statements earlier clients left on the server it was lent.

use std::ops::{Deref, DerefMut};
use std::str::FromStr;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgQueryResult, PgRow, PgStatement, PgTypeInfo};
use sqlx::{Either, Execute, Executor, PgConnection, PgPool, Postgres, SqlStr, Transaction};

/// What stands between shardkeep and Postgres (`SHARDKEEP_PG_POOLER`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PgPooler {
    /// Nothing, or a pooler in session mode: one server connection per client connection, and
    /// prepared statements cached per connection.
    #[default]
    None,
    /// A pooler in transaction mode (PgBouncer's `pool_mode = transaction`): every statement runs
    /// inside a transaction, without named statements kept across transactions and without
    /// session-level state.
    Transaction,
}

impl PgPooler {
    /// The setting's spelling of this mode.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Transaction => "transaction",
        }
    }

    /// True when statements must be kept inside transactions.
    pub fn pins_transactions(self) -> bool {
        self == Self::Transaction
    }
}

/// `SHARDKEEP_PG_POOLER` was not one of its values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("SHARDKEEP_PG_POOLER must be none, session or transaction, not {0:?}")]
pub struct UnknownPooler(pub String);

impl FromStr for PgPooler {
    type Err = UnknownPooler;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "none" | "session" => Ok(Self::None),
            "transaction" => Ok(Self::Transaction),
            _ => Err(UnknownPooler(s.to_string())),
        }
    }
}

/// The statement that opens a transaction through a transaction-mode pooler: it also drops
/// every prepared statement the lent server holds, so names left by another client (or by this
/// one on another server) can never clash with the ones this transaction prepares.
pub(crate) const PINNED_BEGIN: &str = "BEGIN; DEALLOCATE ALL";

/// Opens a transaction on `pool` the way `pooler` needs.
pub(crate) async fn begin(
    pool: &PgPool,
    pooler: PgPooler,
) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
    if pooler.pins_transactions() {
        pool.begin_with(PINNED_BEGIN).await
    } else {
        pool.begin().await
    }
}

/// Opens a transaction on `pool` whose statements and idle spells are each bounded by `bound`
/// (see [`super::PostgresBackend::begin_bounded`]).
pub(crate) async fn begin_bounded(
    pool: &PgPool,
    pooler: PgPooler,
    bound: std::time::Duration,
) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
    let ms = bound.as_millis().clamp(1, i32::MAX as u128);
    let open = if pooler.pins_transactions() {
        PINNED_BEGIN
    } else {
        "BEGIN"
    };
    // Only an integer of this process's own is formatted into the statement.
    pool.begin_with(sqlx::AssertSqlSafe(format!(
        "{open}; SET LOCAL statement_timeout = {ms}; \
         SET LOCAL idle_in_transaction_session_timeout = {ms}"
    )))
    .await
}

/// The body of a single-future [`Executor`] method of [`PgExec`]: the pool's own method without
/// a pooler; through a transaction-mode pooler, the same method inside its own transaction.
macro_rules! straight_or_pinned {
    ($exec:ident . $method:ident ( $($arg:ident),* )) => {{
        if !$exec.pooler.pins_transactions() {
            return $exec.pool.$method($($arg),*);
        }
        let pool = $exec.pool.clone();
        let pooler = $exec.pooler;
        Box::pin(async move {
            let mut tx = begin(&pool, pooler).await?;
            let out = (&mut *tx).$method($($arg),*).await?;
            tx.commit().await?;
            Ok(out)
        })
    }};
}

/// An executor over the pool that is safe for the configured pooler: straight on the pool
/// without one, each statement in its own short transaction through a transaction-mode pooler.
/// Rows of a statement are collected before they are handed on in the latter case.
#[derive(Debug, Clone, Copy)]
pub struct PgExec<'p> {
    pub(crate) pool: &'p PgPool,
    pub(crate) pooler: PgPooler,
}

impl<'p> Executor<'p> for PgExec<'p> {
    type Database = Postgres;

    fn fetch_many<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxStream<'e, Result<Either<PgQueryResult, PgRow>, sqlx::Error>>
    where
        'p: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        if !self.pooler.pins_transactions() {
            return self.pool.fetch_many(query);
        }
        let pool = self.pool.clone();
        let pooler = self.pooler;
        futures::stream::once(async move {
            let mut tx = begin(&pool, pooler).await?;
            let steps: Vec<_> = (&mut *tx).fetch_many(query).try_collect().await?;
            tx.commit().await?;
            Ok::<_, sqlx::Error>(futures::stream::iter(steps.into_iter().map(Ok)))
        })
        .try_flatten()
        .boxed()
    }

    fn fetch_optional<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxFuture<'e, Result<Option<PgRow>, sqlx::Error>>
    where
        'p: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        straight_or_pinned!(self.fetch_optional(query))
    }

    fn prepare_with<'e>(
        self,
        sql: SqlStr,
        parameters: &'e [PgTypeInfo],
    ) -> BoxFuture<'e, Result<PgStatement, sqlx::Error>>
    where
        'p: 'e,
    {
        straight_or_pinned!(self.prepare_with(sql, parameters))
    }

    fn describe<'e>(
        self,
        sql: SqlStr,
    ) -> BoxFuture<'e, Result<sqlx::Describe<Postgres>, sqlx::Error>>
    where
        'p: 'e,
    {
        straight_or_pinned!(self.describe(sql))
    }
}

/// A connection for a few statements in a row: a pooled connection in autocommit without a
/// pooler, a transaction through a transaction-mode pooler (so the statements share one server).
/// [`PgSession::finish`] commits the latter; dropping it unfinished rolls it back.
#[derive(Debug)]
pub enum PgSession {
    /// Each statement commits on its own.
    Autocommit(PoolConnection<Postgres>),
    /// The statements commit together at [`PgSession::finish`].
    Pinned(Transaction<'static, Postgres>),
}

impl PgSession {
    /// Acquires one the way `pooler` needs.
    pub(crate) async fn open(pool: &PgPool, pooler: PgPooler) -> Result<Self, sqlx::Error> {
        Ok(if pooler.pins_transactions() {
            Self::Pinned(begin(pool, pooler).await?)
        } else {
            Self::Autocommit(pool.acquire().await?)
        })
    }

    /// Commits what a pinned session did (an autocommit one has nothing left to commit).
    pub async fn finish(self) -> Result<(), sqlx::Error> {
        match self {
            Self::Autocommit(_) => Ok(()),
            Self::Pinned(tx) => tx.commit().await,
        }
    }
}

impl Deref for PgSession {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        match self {
            Self::Autocommit(conn) => conn,
            Self::Pinned(tx) => tx,
        }
    }
}

impl DerefMut for PgSession {
    fn deref_mut(&mut self) -> &mut PgConnection {
        match self {
            Self::Autocommit(conn) => conn,
            Self::Pinned(tx) => tx,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_setting_names_its_modes_and_refuses_others() {
        assert_eq!("transaction".parse(), Ok(PgPooler::Transaction));
        assert_eq!(" Transaction ".parse(), Ok(PgPooler::Transaction));
        assert_eq!("none".parse(), Ok(PgPooler::None));
        assert_eq!("session".parse(), Ok(PgPooler::None));
        assert_eq!("".parse(), Ok(PgPooler::None));
        let err = "statement".parse::<PgPooler>().unwrap_err();
        assert!(err.to_string().contains("none, session or transaction"));
        assert!(PgPooler::Transaction.pins_transactions());
        assert!(!PgPooler::None.pins_transactions());
    }
}
