//! GCS: an event object grows by compose, through GCS's JSON API (`storage::gcs`). Every
//! version is written whole as a media upload conditional on the generation it grows from
//! (`ifGenerationMatch`, 0 for a first version: [`GcsAppender::put_whole`]); the next one is
//! the new bytes uploaded as a *part* object of their own, then composed onto the object
//! ([`GcsAppender::append`]): the object's metadata (its generation must be the record's,
//! its size the recorded length), the part uploaded with `ifGenerationMatch=0`, then
//! `compose` of [object at its generation, part at its generation] into the object with
//! `ifGenerationMatch` on that generation, each source pinned by
//! `objectPreconditions.ifGenerationMatch`; then the part deleted (conditional on its
//! generation). Only the new bytes (and a compose request of about 400 bytes) cross the
//! network. Nothing is visible before the compose, which replaces the object at once: a
//! reader sees the old or the new version, never a part of one.
//!
//! A part is named `.<object name>.<node tag>.rhc-part` beside its object (the node tag is
//! the host name, as the `file://` temporaries' `.rhc-tmp`): the history server (which wants
//! `-YYYY-MM-DD-HH[-<n>][.jsonl][.gz]` at the end) and our readers never take it for an
//! object, and no other node writes that name. A part a killed run left is found by the
//! next upload of that name (412: deleted, then uploaded again), and by
//! [`GcsAppender::prepare`] at the next start, which lists this node's parts under the
//! history prefix and deletes them. A late part upload of a killed run can never be composed
//! in: every source is pinned to the generation this run uploaded.
//!
//! Anything else is the object changed ([`AppendError::Changed`]: the caller writes it whole,
//! conditional on the generation it reads, `storage::versioned`): another generation or size,
//! no generation recorded, a 412 to the compose (written behind our back in between), or a
//! composite that would pass GCS's [`MAX_COMPONENTS`] (written whole, one component again).
//! The components are GCS's `componentCount` or those we record in the object's metadata
//! (`rhc-components`), whichever is more.
//!
//! **When the JSON API is not there.** Whether it is, is decided by a probe
//! ([`GcsAppender::usable`]): a part uploaded, then composed onto itself with a wrong
//! `ifGenerationMatch` (it must be refused, 412), then deleted. Nothing waits for the probe
//! (review r35h D1): the start of the run starts it in a task of its own (its part beside
//! `<history prefix>/rhc-probe`; a probe asked again, by a whole write: beside its object),
//! each of its requests made once and cut after [`PROBE_DEADLINE`], and until it finds the JSON API
//! usable every version is written whole with `object_store` (XML API, conditional on the
//! generation), as before compose; the shutdown does not wait for it either. An answer that
//! shows no JSON API (moto or another S3-compatible server behind `gs://`:
//! `gcs::NO_JSON_API`), a compose that lands despite the wrong generation (an emulator that
//! ignores it: fake-gcs-server), or a refusal (403: no permission to compose or delete)
//! turns the wire off for the run, said once (WARN). A transient failure (a timeout, a 5xx,
//! a connection error) decides nothing: the probe is started again by a write no sooner
//! than [`PROBE_RETRY_AFTER`] later, and after [`MAX_UNSETTLED_PROBES`] such probes the
//! wire is turned off for the run (the same one WARN). Once the probe found it usable, a
//! JSON request that fails is that publication's failure (tried again at the next round, as
//! any store error), and the shutdown's last publications are cut at `--shutdown-timeout`
//! as those through `object_store` are.
//!
//! The start's cleanup ([`GcsAppender::remove_parts`], a task of its own: nothing waits for
//! it) lists and deletes on the same quick wire as the probe. It deletes any object under
//! the history and quarantine prefixes named as a part of this host is
//! (`.<something>.<host>.rhc-part`), whether or not its object exists: a user's object of
//! that shape there would go too.

use std::io::{Seek, SeekFrom};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::multipart::read_exact_blocking;
use super::{read_err, wire_failure, AppendError, Appended};
use crate::storage::gcs::{no_json_api, GcsObject, GcsWire, MAX_COMPONENTS};
use crate::storage::wire::{Failure, WireError};
use crate::util::fs::Beneath;

/// The end of a part's name (see the module doc).
pub const GCS_PART_SUFFIX: &str = ".rhc-part";

/// A probe that found nothing (a transient failure) is not started again before this.
pub const PROBE_RETRY_AFTER: Duration = Duration::from_secs(30);
/// Probes that found nothing, after which the JSON API is taken as unusable for the run.
pub const MAX_UNSETTLED_PROBES: u32 = 5;
/// Each request of a probe, and of the start's cleanup of parts, is made once and cut after
/// this.
pub const PROBE_DEADLINE: Duration = Duration::from_secs(10);

const UNDECIDED: u8 = 0;
const ON: u8 = 1;
const OFF: u8 = 2;

/// The part object beside the object `key` that its new bytes are uploaded to.
pub fn part_name(key: &str) -> String {
    let tag = super::local_temp_tag();
    match key.rsplit_once('/') {
        Some((dir, name)) => format!("{dir}/.{name}.{tag}{GCS_PART_SUFFIX}"),
        None => format!(".{key}.{tag}{GCS_PART_SUFFIX}"),
    }
}

/// Uploads `body` as the part `part` with `wire` (only if there is none: one a killed run
/// left is deleted first).
async fn upload_part(wire: &GcsWire, part: &str, body: Bytes) -> Result<GcsObject, WireError> {
    match wire.upload(part, body.clone(), Some(0)).await {
        Err(e) if e.failure == Failure::Precondition => {
            if let Some(old) = wire.stat(part).await? {
                tracing::info!(%part, "deleting a part an earlier run left");
                match wire.delete(part, old.generation).await {
                    Ok(()) => {}
                    Err(e) if matches!(e.failure, Failure::Missing | Failure::Precondition) => {}
                    Err(e) => return Err(e),
                }
            }
            wire.upload(part, body, Some(0)).await
        }
        r => r,
    }
}

/// Whether `name` has the shape of a part of this host ([`part_name`]): `.<name>.<host
/// tag>.rhc-part`, a hidden name with something before the tag (see the module doc for what
/// else of that shape the start's cleanup deletes).
fn is_part(name: &str) -> bool {
    let base = name.rsplit_once('/').map_or(name, |(_, b)| b);
    let end = format!(".{}{GCS_PART_SUFFIX}", super::local_temp_tag());
    base.strip_prefix('.')
        .and_then(|b| b.strip_suffix(end.as_str()))
        .is_some_and(|object| !object.is_empty())
}

/// Grows GCS objects by compose (see the module doc).
#[derive(Debug)]
pub struct GcsAppender {
    /// The requests.
    pub wire: GcsWire,
    /// The most components an object grows to ([`MAX_COMPONENTS`]; fewer in tests only).
    max_components: u64,
    /// [`UNDECIDED`], [`ON`] or [`OFF`].
    state: AtomicU8,
    /// The probe: whether one is running, and when the next may start.
    probing: std::sync::Mutex<Probing>,
    /// Parts this run is using now (uploaded, not yet deleted): never cleaned up.
    in_flight: std::sync::Mutex<std::collections::HashSet<String>>,
}

/// Where the probe stands (see the module doc).
#[derive(Debug, Default)]
struct Probing {
    /// A probe is running (in its own task).
    running: bool,
    /// Probes that found nothing (a transient failure).
    unsettled: u32,
    /// No probe before this (after one that found nothing).
    next: Option<Instant>,
}

/// Keeps a part's name among those in use while it lives.
struct InFlight<'a> {
    set: &'a std::sync::Mutex<std::collections::HashSet<String>>,
    name: String,
}

impl<'a> InFlight<'a> {
    fn new(
        set: &'a std::sync::Mutex<std::collections::HashSet<String>>,
        name: &str,
    ) -> InFlight<'a> {
        set.lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.to_string());
        InFlight {
            set,
            name: name.to_string(),
        }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.set
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.name);
    }
}

impl GcsAppender {
    /// An appender making its requests with `wire`, growing an object to at most
    /// `max_components` components ([`MAX_COMPONENTS`]).
    pub fn new(wire: GcsWire, max_components: u64) -> Arc<GcsAppender> {
        Arc::new(GcsAppender {
            wire,
            max_components: max_components.clamp(2, MAX_COMPONENTS),
            state: AtomicU8::new(UNDECIDED),
            probing: Default::default(),
            in_flight: Default::default(),
        })
    }

    /// Whether event objects grow by compose on this store now: only once a probe found the
    /// JSON API usable (see the module doc); before that, and once it is off, every version
    /// is written whole through `object_store`.
    pub fn appends_on(&self) -> bool {
        self.state.load(Ordering::Acquire) == ON
    }

    fn turn_off(&self, why: &str, e: &dyn std::fmt::Display) {
        if self.state.swap(OFF, Ordering::Relaxed) != OFF {
            tracing::warn!(error = %e, "{why}: event objects on gs:// are written whole at every publication for the rest of this run, with object_store's XML API (docs/storage.md)");
        }
    }

    /// Whether the JSON API is there and honours preconditions: `Some(true)` once a probe
    /// found it so, `Some(false)` once it is off, `None` while undecided. Never waits: the
    /// first call of the run (`key`: the object about to be written, beside which the test
    /// part goes) starts the probe in a task of its own, and so does the first call after
    /// [`PROBE_RETRY_AFTER`] when a probe found nothing (see the module doc); the caller
    /// writes through `object_store` meanwhile.
    pub fn usable(self: &Arc<Self>, key: &str) -> Option<bool> {
        match self.state.load(Ordering::Acquire) {
            ON => return Some(true),
            OFF => return Some(false),
            _ => {}
        }
        {
            let mut p = self.probing.lock().unwrap_or_else(|p| p.into_inner());
            if p.running || p.next.is_some_and(|t| Instant::now() < t) {
                return None;
            }
            p.running = true;
        }
        let this = self.clone();
        let key = key.to_string();
        tokio::spawn(async move {
            let verdict = this.probe(&key).await;
            let mut p = this.probing.lock().unwrap_or_else(|p| p.into_inner());
            p.running = false;
            if verdict.is_none() {
                p.unsettled += 1;
                if p.unsettled >= MAX_UNSETTLED_PROBES {
                    this.turn_off(
                        "whether GCS's JSON API is there and composes conditionally could not be told",
                        &format!("{MAX_UNSETTLED_PROBES} probes failed (timeouts, 5xx or connection errors)"),
                    );
                } else {
                    p.next = Some(Instant::now() + PROBE_RETRY_AFTER);
                }
            }
        });
        None
    }

    /// Waits until no probe is running, at most `limit` (tests only: `storage::TEST_GCS_PROBE_FIRST`).
    pub async fn probe_ended(&self, limit: Duration) {
        let end = Instant::now() + limit;
        while Instant::now() < end
            && self
                .probing
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .running
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// One probe (see the module doc), its requests on the [`PROBE_DEADLINE`] wire; `None`:
    /// it found nothing (a transient failure).
    async fn probe(&self, key: &str) -> Option<bool> {
        let wire = self.wire.quick(PROBE_DEADLINE);
        let part = part_name(key);
        let _using = InFlight::new(&self.in_flight, &part);
        let decided = |e: &WireError| {
            no_json_api(e) || matches!(e.failure, Failure::Unsupported | Failure::Refused)
        };
        // A GET first: a server without the JSON API tells at once (an S3-compatible one
        // answers 404 NoSuchBucket for the bucket `storage`; moto answers an upload 500).
        match wire.stat(&part).await {
            Ok(_) => {}
            Err(e) if decided(&e) => {
                self.turn_off(
                    "GCS's JSON API is not there, or refuses to read an object",
                    &e,
                );
                return Some(false);
            }
            Err(e) => {
                tracing::info!(error = %e, "could not tell whether GCS's JSON API is there; asked again later, versions go through object_store meanwhile");
                return None;
            }
        }
        let generation = match upload_part(&wire, &part, Bytes::from_static(b"probe\n")).await {
            Ok(o) => o.generation,
            Err(e) if decided(&e) => {
                self.turn_off("GCS's JSON API is not there, or refuses our uploads", &e);
                return Some(false);
            }
            Err(e) => {
                tracing::info!(error = %e, "could not tell whether GCS's JSON API is there; asked again later, versions go through object_store meanwhile");
                return None;
            }
        };
        let wrong = if generation == 1 { 2 } else { 1 };
        let answer = wire.compose(&part, &[(&part, generation)], wrong, 1).await;
        let mut left = generation;
        let verdict = match answer {
            Err(e) if e.failure == Failure::Precondition => {
                self.state.store(ON, Ordering::Release);
                tracing::info!("GCS's JSON API refuses a compose onto a changed object: event objects on gs:// grow by compose");
                Some(true)
            }
            Ok(o) => {
                left = o.generation;
                self.turn_off(
                    "the store composed onto an object whose generation was not the one named (an emulator that ignores ifGenerationMatch?)",
                    &format!("generation {generation} composed with ifGenerationMatch={wrong}"),
                );
                Some(false)
            }
            Err(e) if decided(&e) => {
                self.turn_off("the store refused a compose (no JSON API, or no permission to compose: docs/storage.md)", &e);
                Some(false)
            }
            Err(e) => {
                tracing::info!(error = %e, "could not tell whether the store composes conditionally; asked again later, versions go through object_store meanwhile");
                None
            }
        };
        if let Err(e) = wire.delete(&part, left).await {
            tracing::debug!(error = %e, %part, "could not delete the test part; the next start does");
        }
        verdict
    }

    /// Composes the bytes `[from, to)` of `file` onto the object `key`, which must hold `from`
    /// bytes at the generation `version`.
    pub async fn append(
        &self,
        key: &str,
        file: &Beneath,
        from: u64,
        to: u64,
        version: Option<&str>,
    ) -> Result<Appended, AppendError> {
        let changed = |why: String| AppendError::Changed {
            key: key.to_string(),
            why,
        };
        let Some(generation) = version.and_then(|v| v.trim().parse::<u64>().ok()) else {
            return Err(changed("no generation recorded for the object".into()));
        };
        if !self.appends_on() {
            return Err(AppendError::Refused {
                key: key.to_string(),
                unsupported: true,
                message: "appends are off on this store (for this run, or until a probe finds GCS's JSON API usable)".into(),
            });
        }
        let obj = match self.wire.stat(key).await {
            Ok(Some(o)) => o,
            Ok(None) => return Err(changed("the object is gone".into())),
            Err(e) => return Err(wire_failure(key, e)),
        };
        if obj.generation != generation {
            return Err(changed(format!(
                "the object's generation is {}, the record says {generation}",
                obj.generation
            )));
        }
        if obj.size != from {
            return Err(changed(format!(
                "the object has {} bytes, the record says {from}",
                obj.size
            )));
        }
        if obj.components + 1 > self.max_components {
            return Err(changed(format!(
                "{} components: another would pass the {} an object may have; written whole",
                obj.components, self.max_components
            )));
        }
        let path = file.path();
        let mut src = file.open().map_err(|e| read_err(&path, e))?;
        src.seek(SeekFrom::Start(from))
            .map_err(|e| read_err(&path, e))?;
        let (bytes, _) = read_exact_blocking(src, to - from, &path).await?;
        let tail = xxhash_rust::xxh3::xxh3_64(&bytes);
        let part = part_name(key);
        let _using = InFlight::new(&self.in_flight, &part);
        let uploaded = upload_part(&self.wire, &part, Bytes::from(bytes))
            .await
            .map_err(|e| wire_failure(key, e))?;
        let composed = self
            .wire
            .compose(
                key,
                &[(key, generation), (&part, uploaded.generation)],
                generation,
                obj.components + 1,
            )
            .await;
        if let Err(e) = self.wire.delete(&part, uploaded.generation).await {
            tracing::debug!(error = %e, %part, "could not delete a part after its compose; the next upload of it or the next start does");
        }
        let new = composed.map_err(|e| wire_failure(key, e))?;
        Ok(Appended {
            bytes: to - from,
            e_tag: new.e_tag,
            version: Some(new.generation.to_string()),
            tail: Some(tail),
        })
    }

    /// At start: deletes the parts of this node (by its tag) an earlier run left under
    /// `history_prefix` (not those this run is using); the number deleted.
    pub async fn remove_parts(&self, history_prefix: &str) -> usize {
        if self.state.load(Ordering::Relaxed) == OFF {
            return 0;
        }
        let prefix = format!("{}/", history_prefix.trim_end_matches('/'));
        let end = format!(".{}{GCS_PART_SUFFIX}", super::local_temp_tag());
        let glob = format!("{prefix}**{end}");
        // Nothing waits for this (it runs in a task of its own from the start), but against a
        // hung JSON API it should not run on for minutes either.
        let wire = self.wire.quick(PROBE_DEADLINE);
        let listed = match wire.list(&prefix, &glob).await {
            Ok(l) => l,
            Err(e) if no_json_api(&e) => {
                self.turn_off("GCS's JSON API is not there", &e);
                return 0;
            }
            Err(e) => {
                tracing::info!(error = %e, %prefix, "could not list the parts an earlier run may have left; the next upload of each deletes it");
                return 0;
            }
        };
        let mut removed = 0;
        for o in listed.into_iter().filter(|o| is_part(&o.name)) {
            let using = self
                .in_flight
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(&o.name);
            if using {
                continue;
            }
            match wire.delete(&o.name, o.generation).await {
                Ok(()) => removed += 1,
                Err(e) => {
                    tracing::info!(error = %e, part = %o.name, "could not delete a part an earlier run left")
                }
            }
        }
        removed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_sit_beside_their_object() {
        let p = part_name("r/h/s/n/node_events/n-2026-11-22-02-1.jsonl.gz");
        assert!(p.starts_with("r/h/s/n/node_events/.n-2026-11-22-02-1.jsonl.gz."));
        assert!(p.ends_with(GCS_PART_SUFFIX));
        assert!(part_name("top").starts_with(".top."));
        assert!(is_part(&p));
        assert!(is_part(&part_name("top")));
        let tag = super::super::local_temp_tag();
        // Not ours: no leading dot, no object name, another host's tag.
        assert!(!is_part(&format!("r/h/x.{tag}{GCS_PART_SUFFIX}")));
        assert!(!is_part(&format!("r/h/.{tag}{GCS_PART_SUFFIX}")));
        assert!(!is_part(&format!("r/h/.x.{tag}-other{GCS_PART_SUFFIX}")));
    }
}
