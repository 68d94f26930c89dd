//! The arena's character model, in the two schema versions the game has shipped.
//!
//! Version 1 stored a fighter's money as `gold`; version 2 calls it `coins` and adds a `title`.
//! [`ArenaV2`] upgrades a version-1 document on load, and the core then refuses to let a
//! version-1 process load (or write over) a character a version-2 process has saved.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use shardkeep::character::StateJson;
use shardkeep::live::LiveGame;
use shardkeep::model::{Anchor, GameEffect, GameModel, ModelHandle};

/// A fighter as the game plays it, whatever the stored version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fighter {
    /// Hit points.
    pub hp: i64,
    /// Experience.
    pub xp: i64,
    /// Money.
    pub money: i64,
    /// Stackable items by name.
    pub bag: BTreeMap<String, u32>,
    /// A title (version 2 only; version 1 has none).
    pub title: Option<String>,
}

impl Fighter {
    /// A new fighter.
    pub(crate) fn fresh() -> Self {
        Self {
            hp: 100,
            xp: 0,
            money: 0,
            bag: BTreeMap::new(),
            title: None,
        }
    }

    /// One line for the protocol.
    pub(crate) fn describe(&self) -> String {
        let bag: Vec<String> = self.bag.iter().map(|(k, n)| format!("{k}:{n}")).collect();
        format!(
            "hp={} xp={} money={} bag={} title={}",
            self.hp,
            self.xp,
            self.money,
            if bag.is_empty() {
                "-".into()
            } else {
                bag.join(",")
            },
            self.title.as_deref().unwrap_or("-")
        )
    }
}

/// The version-1 document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DocV1 {
    hp: i64,
    xp: i64,
    gold: i64,
    bag: BTreeMap<String, u32>,
}

/// The version-2 document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DocV2 {
    hp: i64,
    xp: i64,
    coins: i64,
    bag: BTreeMap<String, u32>,
    title: String,
}

/// What a reward job carries: loot, granted once per idempotency key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub(crate) enum ArenaEffect {
    /// Money and one item.
    #[serde(rename = "arena_loot")]
    Loot {
        /// Money added.
        money: i64,
        /// The item added to the bag.
        item: String,
    },
}

impl GameEffect for ArenaEffect {
    fn kind(&self) -> &'static str {
        "arena_loot"
    }

    fn sets_value(&self) -> bool {
        false
    }

    fn validate(&self) -> Result<(), String> {
        let Self::Loot { money, item } = self;
        if *money < 0 {
            return Err("loot money must not be negative".into());
        }
        if item.is_empty() || item.len() > 32 || !item.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err("an item name is 1 to 32 letters or digits".into());
        }
        Ok(())
    }
}

impl ArenaEffect {
    fn apply_to(&self, fighter: &mut Fighter) {
        let Self::Loot { money, item } = self;
        fighter.money = fighter.money.saturating_add(*money);
        *fighter.bag.entry(item.clone()).or_default() += 1;
    }
}

/// The first release's model.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ArenaV1;

impl GameModel for ArenaV1 {
    type State = DocV1;
    type Effect = ArenaEffect;

    fn apply_effect(
        &self,
        doc: &mut DocV1,
        _anchor: &mut Anchor,
        effect: &ArenaEffect,
    ) -> Result<bool, String> {
        let mut fighter = v1_fighter(doc.clone());
        effect.apply_to(&mut fighter);
        *doc = v1_doc(&fighter);
        Ok(true)
    }
}

/// The current release's model.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ArenaV2;

impl GameModel for ArenaV2 {
    type State = DocV2;
    type Effect = ArenaEffect;
    const SCHEMA_VERSION: u32 = 2;

    fn upcast(&self, from: u32, state: serde_json::Value) -> Result<serde_json::Value, String> {
        if from != 1 {
            return Err(format!("no upcaster from version {from}"));
        }
        let old: DocV1 = serde_json::from_value(state).map_err(|e| e.to_string())?;
        let mut fighter = v1_fighter(old);
        fighter.title = Some("novice".into());
        serde_json::to_value(v2_doc(&fighter)).map_err(|e| e.to_string())
    }

    fn apply_effect(
        &self,
        doc: &mut DocV2,
        _anchor: &mut Anchor,
        effect: &ArenaEffect,
    ) -> Result<bool, String> {
        let mut fighter = v2_fighter(doc.clone());
        effect.apply_to(&mut fighter);
        *doc = v2_doc(&fighter);
        Ok(true)
    }
}

fn v1_fighter(doc: DocV1) -> Fighter {
    Fighter {
        hp: doc.hp,
        xp: doc.xp,
        money: doc.gold,
        bag: doc.bag,
        title: None,
    }
}

fn v1_doc(f: &Fighter) -> DocV1 {
    DocV1 {
        hp: f.hp,
        xp: f.xp,
        gold: f.money,
        bag: f.bag.clone(),
    }
}

fn v2_fighter(doc: DocV2) -> Fighter {
    Fighter {
        hp: doc.hp,
        xp: doc.xp,
        money: doc.coins,
        bag: doc.bag,
        title: Some(doc.title),
    }
}

fn v2_doc(f: &Fighter) -> DocV2 {
    DocV2 {
        hp: f.hp,
        xp: f.xp,
        coins: f.money,
        bag: f.bag.clone(),
        title: f.title.clone().unwrap_or_else(|| "novice".into()),
    }
}

/// The release this process runs: its model and how it reads and writes documents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Release {
    /// Schema version 1.
    V1,
    /// Schema version 2.
    V2,
}

impl Release {
    /// The release for schema `version`.
    pub(crate) fn of(version: u32) -> Option<Self> {
        match version {
            1 => Some(Self::V1),
            2 => Some(Self::V2),
            _ => None,
        }
    }

    /// Its schema version.
    pub(crate) fn version(self) -> u32 {
        match self {
            Self::V1 => ArenaV1::SCHEMA_VERSION,
            Self::V2 => ArenaV2::SCHEMA_VERSION,
        }
    }

    /// Its model, for the core's workers and loader.
    pub(crate) fn model(self) -> ModelHandle {
        match self {
            Self::V1 => ModelHandle::new(ArenaV1),
            Self::V2 => ModelHandle::new(ArenaV2),
        }
    }

    /// Reads a document of this release (the loader has already upgraded it).
    pub(crate) fn read(self, state: &serde_json::Value) -> Result<Fighter, String> {
        let err = |e: serde_json::Error| e.to_string();
        Ok(match self {
            Self::V1 => v1_fighter(serde_json::from_value(state.clone()).map_err(err)?),
            Self::V2 => v2_fighter(serde_json::from_value(state.clone()).map_err(err)?),
        })
    }

    /// Writes a fighter as this release's document.
    pub(crate) fn write(self, fighter: &Fighter) -> Result<StateJson, String> {
        match self {
            Self::V1 => StateJson::encode(&v1_doc(fighter)),
            Self::V2 => StateJson::encode(&v2_doc(fighter)),
        }
        .map_err(|e| e.to_string())
    }
}

/// The arena as shardkeep's runtime plays it: a [`Fighter`] in memory, written as the running
/// release's document.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Arena(pub(crate) Release);

impl LiveGame for Arena {
    type Character = Fighter;
    type Effect = ArenaEffect;

    fn model(&self) -> ModelHandle {
        self.0.model()
    }

    fn load(&self, state: &StateJson) -> Result<Fighter, String> {
        self.0.read(state.value())
    }

    fn dump(&self, fighter: &Fighter) -> Result<StateJson, String> {
        self.0.write(fighter)
    }

    fn apply(
        &self,
        fighter: &mut Fighter,
        _: &mut Anchor,
        effect: &ArenaEffect,
    ) -> Result<bool, String> {
        effect.apply_to(fighter);
        Ok(true)
    }

    fn fresh(&self) -> Fighter {
        Fighter::fresh()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_two_upgrades_a_version_one_document() {
        let v1 = Release::V1
            .write(&Fighter {
                money: 7,
                ..Fighter::fresh()
            })
            .unwrap();
        assert_eq!(v1["gold"], 7);
        let v2 = Release::V2.model().upgrade(1, v1.to_value()).unwrap();
        assert_eq!(v2["coins"], 7);
        assert_eq!(v2["title"], "novice");
        assert!(Release::V1.read(&v2).is_err(), "v1 cannot read v2");
        assert!(Release::V1.model().upgrade(2, v2).is_err(), "v1 refuses v2");
    }

    #[test]
    fn loot_adds_money_and_one_item() {
        let mut fighter = Fighter::fresh();
        let loot = ArenaEffect::Loot {
            money: 5,
            item: "gem".into(),
        };
        loot.apply_to(&mut fighter);
        loot.apply_to(&mut fighter);
        assert_eq!((fighter.money, fighter.bag["gem"]), (10, 2));
        assert!(
            ArenaEffect::Loot {
                money: -1,
                item: "gem".into()
            }
            .validate()
            .is_err()
        );
        assert!(
            ArenaEffect::Loot {
                money: 1,
                item: "a b".into()
            }
            .validate()
            .is_err()
        );
    }
}
