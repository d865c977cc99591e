//! Azure: an event object grows by a block list. Every version is written as blocks whose
//! ids we choose ([`AzureAppender::put_whole`]: Put Block for each piece, then Put Block
//! List, conditional as the whole PUT it replaces was: `If-None-Match: *` for a first
//! version, `If-Match: <ETag>` after), so that the next version is the new bytes as new
//! blocks committed after the blob's committed ones ([`AzureAppender::append`]): Get Block
//! List (the committed ids, their sizes and the blob's ETag, which must be the record's, the
//! ids ours and their sizes the recorded length), Put Block of the new bytes, Put Block List
//! naming the old ids then the new, with `If-Match` on that ETag. Only the new bytes and the
//! list (about 50 bytes per block) cross the network. Nothing is visible before the commit,
//! which replaces the blob at once: a reader sees the old or the new version, never a part.
//!
//! Block ids are `rhc` + the block's index (5 digits) + 96 bits of the xxh3-128 of its bytes
//! (24 hex), 32 bytes, base64: every id of a blob has the same length, and an id names its
//! bytes, so a Put Block of a killed run delivered late under the same id puts the same
//! bytes. Azure takes a Put Block only with an id as long as those of the blob's uncommitted
//! blocks (400 `InvalidBlobOrBlock` otherwise); ours are as long as `object_store`'s (32 hex
//! digits), so the blocks an older version left uncommitted, killed during a multipart
//! upload of the object (the upgrade path), never clash with ours (review r35a D1: with
//! 24-byte ids they wedged the object). Blocks a run put but did not commit (killed between Put Block and Put Block List)
//! are invisible, and Azure discards them at the next commit of the blob, which does not
//! name them (or after a week). Blocks of another writer with ids of another length make
//! our Put Blocks refused: the caller then writes that version with one Put Blob
//! (`storage::versioned`), which Azure lets discard them.
//!
//! Anything else is the blob changed ([`AppendError::Changed`]: the caller writes it whole
//! as blocks, conditional on the version it finds): another ETag, ids not ours (a blob an
//! older version wrote with Put Blob or object_store's multipart ids, or another writer),
//! ids of ours whose indexes do not run 0, 1, 2, ... in the order listed (review r35a D2),
//! sizes that do not add up, a 412 to the commit (written behind our back in between), a
//! commit naming blocks no longer committed (`InvalidBlockList`: the blob was replaced), or a
//! list that would pass Azure's [`MAX_BLOCKS`] (written whole as fewer, bigger blocks).
//!
//! Get Block List needs read permission: credentials without it (a SAS of create and write
//! only) have it refused 403. The first such refusal turns appends off on this store for the
//! run ([`AzureAppender::appends_on`]), said once (WARN): every version is then written
//! whole, as before appends, without asking again.

use std::io::{Seek, SeekFrom};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use bytes::Bytes;

use super::multipart::read_exact_blocking;
use super::{etag_key, read_err, wire_failure, AppendError, Appended, TAIL_PART};
use crate::storage::azure::{AzureWire, Condition, MAX_BLOCKS, MAX_BLOCK_BYTES};
use crate::storage::wire::Failure;
use crate::util::fs::Beneath;

/// Bytes of a block id before base64: `rhc`, the index in 5 digits, the hash in 24 hex; as
/// many as `object_store`'s own block ids (32 hex digits).
const ID_BYTES: usize = 32;
const ID_PREFIX: &[u8] = b"rhc";
const INDEX_DIGITS: usize = 5;

/// The id of the block at `index` holding `bytes` (see the module doc).
pub fn block_id(index: usize, bytes: &[u8]) -> String {
    let hash = xxhash_rust::xxh3::xxh3_128(bytes) & ((1u128 << 96) - 1);
    let raw = format!("rhc{:05}{hash:024x}", index % 100_000);
    BASE64.encode(raw)
}

/// The index of the block whose id (base64) is `id`, if [`block_id`] made it.
fn index_of(id: &str) -> Option<usize> {
    let raw = BASE64.decode(id).ok()?;
    if raw.len() != ID_BYTES || !raw.starts_with(ID_PREFIX) {
        return None;
    }
    let digits = &raw[ID_PREFIX.len()..ID_PREFIX.len() + INDEX_DIGITS];
    if !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// Whether `id` (base64) is an id [`block_id`] makes.
fn is_ours(id: &str) -> bool {
    index_of(id).is_some()
}

/// Grows Azure block blobs (see the module doc).
#[derive(Debug)]
pub struct AzureAppender {
    /// The requests.
    pub wire: AzureWire,
    /// The most committed blocks a blob grows to ([`MAX_BLOCKS`]; fewer in tests only).
    max_blocks: usize,
    /// Get Block List was refused for lack of permission: no more appends this run.
    appends_off: AtomicBool,
}

impl AzureAppender {
    /// An appender making its requests with `wire`, growing a blob to at most `max_blocks`
    /// committed blocks ([`MAX_BLOCKS`]).
    pub fn new(wire: AzureWire, max_blocks: usize) -> Arc<AzureAppender> {
        Arc::new(AzureAppender {
            wire,
            max_blocks: max_blocks.clamp(1, MAX_BLOCKS),
            appends_off: AtomicBool::new(false),
        })
    }

    /// Whether event objects still grow by blocks on this store: not once a Get Block List
    /// was refused for lack of permission (see the module doc); every version is then
    /// written whole.
    pub fn appends_on(&self) -> bool {
        !self.appends_off.load(Ordering::Relaxed)
    }

    /// Commits the bytes `[from, to)` of `file` as new blocks after the blob `key`'s, which
    /// must hold `from` bytes in blocks of ours and have the ETag `e_tag`.
    pub async fn append(
        &self,
        key: &str,
        file: &Beneath,
        from: u64,
        to: u64,
        e_tag: Option<&str>,
    ) -> Result<Appended, AppendError> {
        let changed = |why: String| AppendError::Changed {
            key: key.to_string(),
            why,
        };
        let Some(want) = e_tag.and_then(etag_key) else {
            return Err(changed("no ETag recorded for the blob".into()));
        };
        if !self.appends_on() {
            return Err(AppendError::Refused {
                key: key.to_string(),
                unsupported: false,
                message: "appends are off on this store for this run (Get Block List refused)"
                    .into(),
            });
        }
        let list = match self.wire.get_block_list(key).await {
            Ok(list) => list,
            Err(e) if e.failure == Failure::Refused && e.status == Some(403) => {
                if !self.appends_off.swap(true, Ordering::Relaxed) {
                    tracing::warn!(%key, error = %e, "Get Block List refused (403): the credentials cannot read blobs (a SAS without read permission?); event objects are written whole at every publication for the rest of this run, as before appends (docs/storage.md: a SAS needs read, create and write)");
                }
                return Err(wire_failure(key, e));
            }
            Err(e) => return Err(wire_failure(key, e)),
        };
        let Some(have) = list.e_tag.clone() else {
            return Err(changed("the blob has no committed blocks".into()));
        };
        if etag_key(&have).as_deref() != Some(want.as_str()) {
            return Err(changed(format!(
                "the blob's ETag is {have:?}, the record says {want:?}"
            )));
        }
        if list.blocks.is_empty() || !list.blocks.iter().all(|b| is_ours(&b.id)) {
            return Err(changed(
                "the blob was not written as blocks of ours (a whole PUT of an older version, or another writer)"
                    .into(),
            ));
        }
        if let Some(at) = list
            .blocks
            .iter()
            .enumerate()
            .position(|(i, b)| index_of(&b.id) != Some(i % 100_000))
        {
            return Err(changed(format!(
                "the blob's blocks are not listed in the order we wrote them (block {at} of {} has the index {:?})",
                list.blocks.len(),
                index_of(&list.blocks[at].id)
            )));
        }
        let size: u64 = list.blocks.iter().map(|b| b.size).sum();
        if size != from {
            return Err(changed(format!(
                "the blob's blocks hold {size} bytes, the record says {from}"
            )));
        }
        let new_blocks = (to - from).div_ceil(TAIL_PART as u64) as usize;
        if list.blocks.len() + new_blocks > self.max_blocks {
            return Err(changed(format!(
                "{} committed blocks: another {new_blocks} would pass the {} a blob may have; written whole as fewer blocks",
                list.blocks.len(),
                self.max_blocks
            )));
        }
        let committed: Vec<String> = list.blocks.into_iter().map(|b| b.id).collect();
        let (ids, tail) = self
            .put_blocks(key, file, (from, to), TAIL_PART as u64, committed.len())
            .await?;
        let (e_tag, _) = self
            .wire
            .put_block_list(key, &committed, &ids, Some(&Condition::ETag(have)))
            .await
            .map_err(|e| wire_failure(key, e))?;
        Ok(Appended {
            bytes: to - from,
            e_tag,
            tail: Some(tail),
            version: None,
        })
    }

    /// Writes the first `len` bytes of `file` as the blob `key`, as blocks of at most
    /// `block_bytes` (more when `len` would need over [`MAX_BLOCKS`]), committed only if the
    /// blob is as `condition` says (`None`: unconditionally); a 412 or 409 is
    /// [`AppendError::Changed`]. What was written and the blob's version id, if any.
    pub async fn put_whole(
        &self,
        key: &str,
        file: &Beneath,
        len: u64,
        block_bytes: u64,
        condition: Option<&Condition>,
    ) -> Result<(Appended, Option<String>), AppendError> {
        let block = block_bytes
            .max(len.div_ceil(MAX_BLOCKS as u64))
            .clamp(1, MAX_BLOCK_BYTES);
        let (ids, tail) = self.put_blocks(key, file, (0, len), block, 0).await?;
        let (e_tag, version) = self
            .wire
            .put_block_list(key, &[], &ids, condition)
            .await
            .map_err(|e| wire_failure(key, e))?;
        Ok((
            Appended {
                bytes: len,
                e_tag,
                tail: Some(tail),
                version: None,
            },
            version,
        ))
    }

    /// Puts the bytes `[from, to)` of `file` as blocks of at most `block` bytes, the first
    /// at index `first`, one in memory at a time; their ids and the hash of the bytes.
    async fn put_blocks(
        &self,
        key: &str,
        file: &Beneath,
        (from, to): (u64, u64),
        block: u64,
        first: usize,
    ) -> Result<(Vec<String>, u64), AppendError> {
        let path = file.path();
        let mut src = file.open().map_err(|e| read_err(&path, e))?;
        src.seek(SeekFrom::Start(from))
            .map_err(|e| read_err(&path, e))?;
        let mut ids = Vec::new();
        let mut hash = xxhash_rust::xxh3::Xxh3Default::new();
        let mut offset = from;
        while offset < to {
            let n = (to - offset).min(block);
            let (bytes, back) = read_exact_blocking(src, n, &path).await?;
            src = back;
            hash.update(&bytes);
            let id = block_id(first + ids.len(), &bytes);
            self.wire
                .put_block(key, &id, Bytes::from(bytes))
                .await
                .map_err(|e| wire_failure(key, e))?;
            ids.push(id);
            offset += n;
        }
        Ok((ids, hash.digest()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_ids_have_one_length_and_name_their_bytes() {
        let a = block_id(0, b"one");
        let b = block_id(49_999, b"a much longer block of bytes");
        assert_eq!(a.len(), b.len());
        // As long as object_store's ids (base64 of 32 hex digits).
        assert_eq!(
            a.len(),
            BASE64.encode("0123456789abcdef0123456789abcdef").len()
        );
        assert!(is_ours(&a) && is_ours(&b));
        assert_eq!((index_of(&a), index_of(&b)), (Some(0), Some(49_999)));
        assert_eq!(a, block_id(0, b"one"));
        assert_ne!(a, block_id(0, b"two"));
        assert_ne!(a, block_id(1, b"one"));
        // object_store's own multipart ids (base64 of 32 hex digits) are not ours.
        assert!(!is_ours(&BASE64.encode("0123456789abcdef0123456789abcdef")));
        assert!(!is_ours("not base64!"));
        assert!(!is_ours(&BASE64.encode("rhc0000x0123456789abcdef01234567")));
    }
}
