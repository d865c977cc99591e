//! Remembers recently accepted event ids so Ray's resent batches are not stored twice.
//!
//! Ray resends a whole batch when our answer took longer than 3 s, with the same `eventId`s.
//! The spool remembers the hashes of the ids it accepted in a bounded window
//! ([`crate::util::dedup::DedupWindow`], 24 to 40 bytes per remembered event). A false match
//! needs two ids to collide in 64 bits while both are in the window: at 262,144 ids that is
//! about one chance in 7·10^13 per event.

/// Hash of an event id as used by the window.
pub fn id_hash(event_id: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(event_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn different_ids_hash_apart() {
        assert_ne!(id_hash(b"a"), id_hash(b"b"));
    }
}
