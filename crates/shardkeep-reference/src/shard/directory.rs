//! The zone directory: which shard owns each zone now. A login routes through it, so a zone that
//! moved to another shard while its players were offline is transparent.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

/// Zone → shard map, shared by every shard of a process. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct ZoneDirectory {
    owners: Arc<RwLock<HashMap<String, String>>>,
}

impl ZoneDirectory {
    /// An empty directory.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records that `shard` owns `zone` (a rebalance is just another assignment).
    pub fn assign(&self, zone: &str, shard: &str) {
        if let Ok(mut owners) = self.owners.write() {
            owners.insert(zone.to_owned(), shard.to_owned());
        }
    }

    /// The shard owning `zone`, if known.
    pub fn shard_for_zone(&self, zone: &str) -> Option<String> {
        self.owners.read().ok().and_then(|o| o.get(zone).cloned())
    }

    /// Zones owned by `shard`, sorted.
    pub fn zones_of(&self, shard: &str) -> Vec<String> {
        let mut zones: Vec<String> = self
            .owners
            .read()
            .map(|o| {
                o.iter()
                    .filter(|(_, s)| s.as_str() == shard)
                    .map(|(z, _)| z.clone())
                    .collect()
            })
            .unwrap_or_default();
        zones.sort();
        zones
    }
}
