//! What operators select dead letters by.

use uuid::Uuid;

/// Picks one character's dead letters: by id, or by name (case-insensitive, exact).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CharacterFilter {
    /// The character's id.
    Id(Uuid),
    /// The character's name.
    Name(String),
}

impl CharacterFilter {
    /// Reads an operator's input: a UUID is an id, anything else (trimmed, non-empty) a name.
    pub fn parse(raw: &str) -> Option<Self> {
        let raw = raw.trim();
        if raw.is_empty() {
            return None;
        }
        Some(match Uuid::parse_str(raw) {
            Ok(id) => Self::Id(id),
            Err(_) => Self::Name(raw.to_owned()),
        })
    }

    /// Whether the character `id` named `name` is the one picked.
    pub fn matches(&self, id: Uuid, name: &str) -> bool {
        match self {
            Self::Id(want) => *want == id,
            // Unicode-aware, as the retry list's `lower(name)` in Postgres.
            Self::Name(want) => want.to_lowercase() == name.to_lowercase(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_is_an_id_or_a_name() {
        let id = Uuid::now_v7();
        assert_eq!(
            CharacterFilter::parse(&format!(" {id} ")),
            Some(CharacterFilter::Id(id))
        );
        assert_eq!(
            CharacterFilter::parse("Aria"),
            Some(CharacterFilter::Name("Aria".into()))
        );
        assert_eq!(CharacterFilter::parse("  "), None);
        assert!(CharacterFilter::Name("aria".into()).matches(id, "ARIA"));
        assert!(CharacterFilter::Name("élise".into()).matches(id, "Élise"));
        assert!(!CharacterFilter::Id(Uuid::now_v7()).matches(id, "Aria"));
    }
}
