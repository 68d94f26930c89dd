//! Redis Cluster hash slots, so tests (and batched deletes) can prove which keys share a slot.

use crc::{CRC_16_XMODEM, Crc};

/// Number of hash slots in a Redis Cluster.
pub const SLOT_COUNT: u16 = 16384;

const CRC16: Crc<u16> = Crc::<u16>::new(&CRC_16_XMODEM);

/// The part of a key that Redis Cluster hashes: the text inside the first non-empty `{…}`, or
/// the whole key when there is none.
pub fn hash_tag(key: &str) -> &str {
    if let Some(open) = key.find('{')
        && let Some(len) = key[open + 1..].find('}')
        && len > 0
    {
        return &key[open + 1..open + 1 + len];
    }
    key
}

/// The cluster slot a key lands in (CRC16/XMODEM of its hash tag, mod 16384).
pub fn key_slot(key: &str) -> u16 {
    CRC16.checksum(hash_tag(key).as_bytes()) % SLOT_COUNT
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_cluster_specification_examples() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(key_slot("123456789"), 0x31C3 % SLOT_COUNT);
        assert_eq!(key_slot("foo"), 12182);
        assert_eq!(
            key_slot("{user1000}.following"),
            key_slot("{user1000}.followers")
        );
        assert_eq!(key_slot("foo{}{bar}"), key_slot("foo{}{bar}"));
        assert_eq!(hash_tag("foo{}{bar}"), "foo{}{bar}");
        assert_eq!(hash_tag("foo{{bar}}zap"), "{bar");
    }
}
