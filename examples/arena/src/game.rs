//! The shard's game: what each command does. Every durable step goes through shardkeep's
//! live-copy runtime — the game plays a [`Fighter`] and says when a write must be durable
//! before the player hears of it (`loot`); the runtime keeps the cadences, the logout save, the
//! journal, handoffs and the fences.

use std::collections::HashMap;

use shardkeep::audit::AuditEvent;
use shardkeep::live::{Admitted, CopyId, FinalSave, Granted, Runtime, SessionStart};
use shardkeep::model::Anchor;
use uuid::Uuid;

use crate::model::{Arena, ArenaEffect, Fighter};

/// The one room every fighter stands in.
const ROOM: &str = "pit";

/// The shard's state, shared by every connection.
pub(crate) struct Game {
    /// This shard's name (its zone).
    pub shard: String,
    runtime: Runtime<Arena>,
    peers: HashMap<String, String>,
}

/// A command's answer: the reply line, and whether the connection ends.
pub(crate) struct Reply {
    /// The line sent back.
    pub line: String,
    /// True when the session is over.
    pub close: bool,
}

fn reply(line: impl Into<String>) -> Reply {
    Reply {
        line: line.into(),
        close: false,
    }
}

fn closing(line: impl Into<String>) -> Reply {
    Reply {
        line: line.into(),
        close: true,
    }
}

fn evicted() -> Reply {
    closing("error this copy was replaced; log in again")
}

impl Game {
    /// The game over a running runtime.
    pub(crate) fn new(
        shard: String,
        runtime: Runtime<Arena>,
        peers: HashMap<String, String>,
    ) -> Self {
        Self {
            shard,
            runtime,
            peers,
        }
    }

    /// Runs one command line for the session playing `current`.
    pub(crate) async fn command(&self, current: &mut Option<Playing>, line: &str) -> Reply {
        let mut words = line.split_whitespace();
        let verb = words.next().unwrap_or_default();
        let arg = words.next();
        if words.next().is_some() {
            return reply("error too many words");
        }
        match (verb, arg, current.as_ref().map(|playing| playing.copy)) {
            ("login", Some(name), None) => self.login(current, name).await,
            ("arrive", Some(token), None) => self.arrive(current, token).await,
            ("login" | "arrive", _, Some(_)) => reply("error already playing"),
            ("fight", None, Some(copy)) => self.fight(copy),
            ("loot", Some(item), Some(copy)) => self.loot(copy, item).await,
            ("look", None, Some(copy)) => self.look(copy),
            ("save", None, Some(copy)) => self.save(copy).await,
            ("travel", Some(shard), Some(copy)) => self.travel(current, copy, shard).await,
            ("quit", None, Some(copy)) => self.quit(current, copy).await,
            ("quit", None, None) => closing("bye"),
            (_, _, None) if !verb.is_empty() => reply("error log in first: login <name>"),
            _ => reply("error unknown command"),
        }
    }

    async fn login(&self, current: &mut Option<Playing>, name: &str) -> Reply {
        let here = Anchor::at(&self.shard, ROOM);
        let id = match self
            .runtime
            .find_or_create(name, Uuid::now_v7(), here)
            .await
        {
            Ok(id) => id,
            Err(err) => return reply(format!("error {err}")),
        };
        match self.runtime.login(id, SessionStart::default()).await {
            Ok(admitted) => self.admit(current, admitted, "ok"),
            Err(err) => reply(format!("error {err}")),
        }
    }

    fn admit(&self, current: &mut Option<Playing>, admitted: Admitted, word: &str) -> Reply {
        let copy = admitted.copy;
        let Ok(described) = self.runtime.read(copy, |f| f.describe()) else {
            return evicted();
        };
        let name = self.name_of(copy);
        *current = Some(Playing {
            copy,
            token: admitted.session_token,
        });
        reply(format!("{word} {name} {described}"))
    }

    fn name_of(&self, copy: CopyId) -> String {
        self.runtime.name(copy).unwrap_or_default()
    }

    fn fight(&self, copy: CopyId) -> Reply {
        let fought = self.runtime.update(copy, |f: &mut Fighter| {
            f.xp += 10;
            f.hp = (f.hp - 1).max(1);
            f.xp
        });
        match fought {
            Ok(xp) => reply(format!("ok fight xp={xp}")),
            Err(_) => evicted(),
        }
    }

    fn look(&self, copy: CopyId) -> Reply {
        match self.runtime.read(copy, |f| f.describe()) {
            Ok(described) => reply(format!("ok {described}")),
            Err(_) => evicted(),
        }
    }

    /// Loot is durable before the player hears of it: the runtime applies it, numbers it and
    /// saves it at once (or stores it as a job when the row has moved on).
    async fn loot(&self, copy: CopyId, item: &str) -> Reply {
        let effect = ArenaEffect::Loot {
            money: 5,
            item: item.to_owned(),
        };
        let granted = self.runtime.grant(copy, effect).await;
        let word = match granted {
            Ok(Granted::Saved { .. }) => "saved",
            Ok(Granted::Queued { .. }) => "queued",
            Err(shardkeep::live::LiveError::Gone(_)) => return evicted(),
            Err(err) => return reply(format!("error loot not stored: {err}")),
        };
        let money = self.runtime.read(copy, |f| f.money).unwrap_or_default();
        self.runtime.audit(AuditEvent::attribute(
            copy.character_id,
            &format!(
                "loot:{}:{}:{}",
                copy.character_id,
                copy.owner_epoch,
                Uuid::now_v7()
            ),
            serde_json::json!({ "item": item, "money": 5 }),
        ));
        reply(format!("{word} loot {item} money={money}"))
    }

    async fn save(&self, copy: CopyId) -> Reply {
        match self.runtime.save_now(copy).await {
            Ok(_) => {
                let xp = self.runtime.read(copy, |f| f.xp).unwrap_or_default();
                reply(format!("saved xp={xp}"))
            }
            Err(shardkeep::live::LiveError::Gone(_)) => evicted(),
            Err(err) => reply(format!("error {err}")),
        }
    }

    /// Hands the fighter to `shard`; the client presents the token there.
    async fn travel(&self, current: &mut Option<Playing>, copy: CopyId, shard: &str) -> Reply {
        let Some(address) = self.peers.get(shard).cloned() else {
            return reply(format!("error no route to shard {shard}"));
        };
        match self
            .runtime
            .hand_off(copy, shard, Anchor::at(shard, ROOM))
            .await
        {
            Ok(ticket) => {
                *current = None;
                closing(format!("travel {} {address}", ticket.token))
            }
            Err(shardkeep::live::LiveError::Gone(_)) => evicted(),
            Err(err) => reply(format!("error handoff not stored: {err}")),
        }
    }

    async fn arrive(&self, current: &mut Option<Playing>, token: &str) -> Reply {
        match self.runtime.arrive(token, SessionStart::default()).await {
            Ok(admitted) => self.admit(current, admitted, "ok arrived"),
            Err(err) => reply(format!("error {err}")),
        }
    }

    async fn quit(&self, current: &mut Option<Playing>, copy: CopyId) -> Reply {
        *current = None;
        match self.runtime.logout(copy).await {
            Ok(FinalSave::Saved { .. }) => closing("bye saved"),
            Ok(FinalSave::QueuedAsJob { .. }) => closing("bye queued"),
            Ok(other) => closing(format!("error final save: {other:?}")),
            Err(_) => evicted(),
        }
    }

    /// The connection dropped without `quit`: the copy waits, link-dead, for a reconnect (a
    /// connection that a reconnect replaced since detaches nothing).
    pub(crate) fn disconnected(&self, playing: &Playing) {
        let _ = self.runtime.detach(playing.copy, &playing.token, 0);
    }
}

/// What one connection plays: the copy and the session it was admitted under.
pub(crate) struct Playing {
    copy: CopyId,
    token: String,
}
