//! The login gate: which shard a login goes to, and the epoch floor its claim starts from.
//!
//! A live placement record names the zone holding the session (so a reconnect reaches the copy
//! that is still held); otherwise the durable `zone_ref` names it. Either zone resolves through
//! the directory to the shard that owns it *now*. The placement record's epoch is the floor of
//! the next claim; when Redis is unreachable the floor is 0 and the row alone decides, since the
//! mint is `max(row, floor) + 1`.

use uuid::Uuid;

use super::directory::ZoneDirectory;
use shardkeep::character::{CharacterStore, StoreError};
use shardkeep::placement::PlacementStore;

/// Where a login should go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The shard owning the zone, if the directory knows it (else the caller's default).
    pub shard: Option<String>,
    /// The zone the route was derived from.
    pub zone: Option<String>,
    /// Epoch floor for the claim.
    pub floor: i64,
    /// True when a live placement says a shard still holds the character.
    pub held: bool,
}

/// Routes a login of `character_id`. Fails closed when the row cannot be read.
pub async fn route_login(
    placement: Option<&PlacementStore>,
    store: &CharacterStore,
    directory: &ZoneDirectory,
    character_id: Uuid,
) -> Result<Route, StoreError> {
    let record = match placement {
        Some(placement) => match placement.read(character_id).await {
            Ok(record) => record,
            Err(err) => {
                tracing::warn!(event = "placement_read_failed", character = %character_id, error = %err,
                    "routing by the durable zone");
                None
            }
        },
        None => None,
    };
    let floor = record.as_ref().map_or(0, |r| r.owner_epoch);
    if let Some(zone) = record.as_ref().and_then(|r| r.zone_id.clone()) {
        return Ok(Route {
            shard: directory.shard_for_zone(&zone),
            zone: Some(zone),
            floor,
            held: true,
        });
    }
    let row = store
        .load(character_id)
        .await?
        .ok_or(StoreError::NotFound(character_id))?;
    Ok(Route {
        shard: row
            .zone_ref
            .as_deref()
            .and_then(|z| directory.shard_for_zone(z)),
        zone: row.zone_ref,
        floor,
        held: false,
    })
}
