//! The shard's side of the saver: events land in a bounded mailbox the shard drains on its own
//! thread each pulse; presence is answered from the residency index.

use tokio::sync::mpsc;
use uuid::Uuid;

use super::residency::ResidencyIndex;
use shardkeep::saver::{SaveFeedback, SaverEvent};

pub(super) struct ShardFeedback {
    pub(super) events: mpsc::Sender<SaverEvent>,
    pub(super) residency: ResidencyIndex,
}

impl SaveFeedback for ShardFeedback {
    fn deliver(&self, event: SaverEvent) {
        if let Err(err) = self.events.try_send(event) {
            // A lost flush-conflict or eviction notice repeats on the next save of that player.
            tracing::warn!(event = "saver_event_dropped", error = %err);
        }
    }

    fn is_present(&self, character_id: Uuid) -> bool {
        self.residency.contains(character_id)
    }
}
