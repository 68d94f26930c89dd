//! The audit read surface: a self view scoped by the caller's stable character id, and a staff
//! view by name that is refused for non-staff before any store call, is rate-limited, and folds
//! in the owning account's tier changes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use uuid::Uuid;

use super::accounts::Tier;
use super::store::{AuditCursor, AuditPage, AuditStore};

/// Who is reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Viewer {
    /// The reader's account.
    pub account_id: Uuid,
    /// Its tier.
    pub tier: Tier,
}

/// A read was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum AuditReadError {
    /// The staff view is for staff only.
    #[error("the staff audit view is for staff only")]
    Forbidden,
    /// Too many staff reads; try again later.
    #[error("too many audit reads; retry in {retry_after:?}")]
    RateLimited {
        /// Time until the window ends.
        retry_after: Duration,
    },
    /// No character has that name.
    #[error("no character named {0:?}")]
    NotFound(String),
    /// Postgres failed.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
}

/// Fixed-window limit on staff reads, per viewer.
#[derive(Debug, Clone)]
pub struct StaffReadLimit {
    max_per_window: u32,
    window: Duration,
    used: Arc<Mutex<HashMap<Uuid, (Instant, u32)>>>,
}

impl StaffReadLimit {
    /// `max_per_window` reads per `window` per viewer.
    pub fn new(max_per_window: u32, window: Duration) -> Self {
        Self {
            max_per_window: max_per_window.max(1),
            window,
            used: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    fn take(&self, viewer: Uuid, now: Instant) -> Result<(), Duration> {
        let Ok(mut used) = self.used.lock() else {
            return Ok(());
        };
        if used.len() > 10_000 {
            let window = self.window;
            used.retain(|_, (start, _)| now.duration_since(*start) < window);
        }
        let entry = used.entry(viewer).or_insert((now, 0));
        if now.duration_since(entry.0) >= self.window {
            *entry = (now, 0);
        }
        if entry.1 >= self.max_per_window {
            return Err(self.window.saturating_sub(now.duration_since(entry.0)));
        }
        entry.1 += 1;
        Ok(())
    }
}

impl Default for StaffReadLimit {
    fn default() -> Self {
        Self::new(30, Duration::from_secs(60))
    }
}

/// Reads the trail. Cheap to clone.
#[derive(Debug, Clone)]
pub struct AuditReader {
    store: AuditStore,
    limit: StaffReadLimit,
}

impl AuditReader {
    /// A reader over `store` with the staff rate limit `limit`.
    pub fn new(store: AuditStore, limit: StaffReadLimit) -> Self {
        Self { store, limit }
    }

    /// The caller's own trail, by its stable character id.
    pub async fn self_view(
        &self,
        character_id: Uuid,
        before: Option<AuditCursor>,
        limit: i64,
    ) -> Result<AuditPage, AuditReadError> {
        Ok(self
            .store
            .character_page(character_id, before, limit)
            .await?)
    }

    /// A character's trail by name, with its account's tier changes: staff only (refused before
    /// any store call), rate-limited per viewer.
    pub async fn staff_view(
        &self,
        viewer: Viewer,
        name: &str,
        before: Option<AuditCursor>,
        limit: i64,
    ) -> Result<AuditPage, AuditReadError> {
        if !viewer.tier.is_staff() {
            return Err(AuditReadError::Forbidden);
        }
        self.limit
            .take(viewer.account_id, Instant::now())
            .map_err(|retry_after| AuditReadError::RateLimited { retry_after })?;
        let (character_id, account_id) = self
            .store
            .character_by_name(name)
            .await?
            .ok_or_else(|| AuditReadError::NotFound(name.to_owned()))?;
        Ok(self
            .store
            .character_with_account_page(character_id, account_id, before, limit)
            .await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_resets_with_the_window() {
        let limit = StaffReadLimit::new(2, Duration::from_secs(10));
        let viewer = Uuid::now_v7();
        let t0 = Instant::now();
        assert!(limit.take(viewer, t0).is_ok());
        assert!(limit.take(viewer, t0).is_ok());
        assert!(limit.take(viewer, t0 + Duration::from_secs(3)).is_err());
        assert!(limit.take(Uuid::now_v7(), t0).is_ok(), "per viewer");
        assert!(limit.take(viewer, t0 + Duration::from_secs(11)).is_ok());
    }
}
