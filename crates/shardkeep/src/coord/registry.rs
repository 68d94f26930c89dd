//! The service registry: instances register with a TTL and heartbeat to stay listed; listing
//! prunes index members whose registration lapsed.

use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use redis::{AsyncCommands, Script};

use super::embedded::RecordFile;
use super::{CoordError, Coordination, decode, encode};
use crate::ttl::Ttl;

static HEARTBEAT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/registry_heartbeat.lua")));

/// Most instances one listing returns.
pub const MAX_LISTED_INSTANCES: usize = 10_000;

/// One registered service instance.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct InstanceRecord {
    /// Unique id of this incarnation.
    pub instance_id: String,
    /// What it is (`game_server`, `serve`, …).
    pub service: String,
    /// Where it can be reached.
    pub address: String,
    /// The shard it hosts, for game servers.
    pub shard_id: Option<String>,
    /// When it registered.
    pub registered_at: DateTime<Utc>,
}

/// Result of listing the registry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RegistryListing {
    /// Live instances, by id.
    pub instances: Vec<InstanceRecord>,
    /// Stale index members removed during the listing.
    pub pruned: usize,
    /// Records that exist but could not be decoded (skipped).
    pub undecodable: usize,
}

impl Coordination {
    /// Registers `record`, live for `ttl` unless refreshed.
    pub async fn registry_register(
        &self,
        record: &InstanceRecord,
        ttl: Ttl,
    ) -> Result<(), CoordError> {
        let key = self.keys().registry_instance(&record.instance_id)?;
        let body = encode(record)?;
        if let Some(file) = self.file() {
            return file.set(&key, &body, ttl).await;
        }
        let () = redis::pipe()
            .atomic()
            .pset_ex(&key, body, ttl.as_millis())
            .ignore()
            .sadd(self.keys().registry_index(), &record.instance_id)
            .ignore()
            .query_async(&mut self.conn()?)
            .await?;
        Ok(())
    }

    /// Extends the registration of `instance_id` by `ttl`; false when it had already lapsed
    /// (the instance must register again).
    pub async fn registry_heartbeat(
        &self,
        instance_id: &str,
        ttl: Ttl,
    ) -> Result<bool, CoordError> {
        if let Some(file) = self.file() {
            return file
                .refresh(&self.keys().registry_instance(instance_id)?, ttl)
                .await;
        }
        let refreshed: i64 = HEARTBEAT
            .key(self.keys().registry_instance(instance_id)?)
            .key(self.keys().registry_index())
            .arg(ttl.as_millis())
            .arg(instance_id)
            .invoke_async(&mut self.conn()?)
            .await?;
        Ok(refreshed == 1)
    }

    /// Removes `instance_id` (a clean shutdown).
    pub async fn registry_deregister(&self, instance_id: &str) -> Result<(), CoordError> {
        let key = self.keys().registry_instance(instance_id)?;
        if let Some(file) = self.file() {
            return file.delete(&[&key]).await.map(drop);
        }
        let () = redis::pipe()
            .atomic()
            .del(&key)
            .ignore()
            .srem(self.keys().registry_index(), instance_id)
            .ignore()
            .query_async(&mut self.conn()?)
            .await?;
        Ok(())
    }

    /// Lists live instances (at most [`MAX_LISTED_INSTANCES`]), pruning stale index members.
    pub async fn registry_list(&self) -> Result<RegistryListing, CoordError> {
        if let Some(file) = self.file() {
            return self.registry_list_in_file(file).await;
        }
        let index = self.keys().registry_index();
        let pruned = self
            .prune_index(&index, MAX_LISTED_INSTANCES, |id| {
                self.keys().registry_instance(id)
            })
            .await?
            .removed;
        metrics::counter!(crate::telemetry::REGISTRY_PRUNED_TOTAL).increment(pruned as u64);
        let mut listing = RegistryListing {
            pruned,
            ..RegistryListing::default()
        };
        let mut conn = self.conn()?;
        let mut cursor: u64 = 0;
        loop {
            let (next, ids): (u64, Vec<String>) = redis::cmd("SSCAN")
                .arg(&index)
                .arg(cursor)
                .arg("COUNT")
                .arg(self.config().scan_count)
                .query_async(&mut conn)
                .await?;
            let keys = ids
                .iter()
                .map(|id| self.keys().registry_instance(id))
                .collect::<Result<Vec<_>, _>>()?;
            if !keys.is_empty() {
                let bodies: Vec<Option<Vec<u8>>> = conn.mget(&keys).await?;
                for (key, body) in keys.iter().zip(bodies) {
                    let Some(body) = body else { continue };
                    match decode::<InstanceRecord>(key, &body) {
                        Ok(record) => listing.instances.push(record),
                        Err(err) => {
                            listing.undecodable += 1;
                            tracing::warn!(event = "registry_record_corrupt", error = %err);
                        }
                    }
                }
            }
            cursor = next;
            if cursor == 0 || listing.instances.len() >= MAX_LISTED_INSTANCES {
                break;
            }
        }
        listing
            .instances
            .sort_by(|a, b| a.instance_id.cmp(&b.instance_id));
        listing
            .instances
            .dedup_by(|a, b| a.instance_id == b.instance_id);
        listing.instances.truncate(MAX_LISTED_INSTANCES);
        Ok(listing)
    }

    /// The listing in the embedded store's file: expired registrations swept (counted as
    /// pruned), then the live ones read in instance order.
    async fn registry_list_in_file(
        &self,
        file: &RecordFile,
    ) -> Result<RegistryListing, CoordError> {
        let prefix = self.keys().registry_instance_prefix();
        let pruned =
            usize::try_from(file.sweep(&prefix, MAX_LISTED_INSTANCES).await?).unwrap_or(usize::MAX);
        metrics::counter!(crate::telemetry::REGISTRY_PRUNED_TOTAL).increment(pruned as u64);
        let mut listing = RegistryListing {
            pruned,
            ..RegistryListing::default()
        };
        for (key, body) in file.page(&prefix, None, MAX_LISTED_INSTANCES).await? {
            match decode::<InstanceRecord>(&key, &body) {
                Ok(record) => listing.instances.push(record),
                Err(err) => {
                    listing.undecodable += 1;
                    tracing::warn!(event = "registry_record_corrupt", error = %err);
                }
            }
        }
        listing
            .instances
            .sort_by(|a, b| a.instance_id.cmp(&b.instance_id));
        Ok(listing)
    }
}
