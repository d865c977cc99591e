//! ray-history-collector: a per-node sidecar that takes the events Ray pushes to it, keeps
//! them durably on disk, and uploads them, with snapshots of the node's logs, in the layout
//! KubeRay's History Server reads.
//!
//! # Layout
//!
//! Three write paths and one read side, each a folder; the bucket contract, the storage
//! backends and the shared helpers beside them:
//!
//! ```text
//! Ray dashboard agent ─POST /v1/events─▶ events::http ─▶ events::parse ─▶ events::route
//!                                                     ─▶ events::dedup ─▶ events::spool ─▶ events::upload ─▶ bucket
//!                                  open segments, every half --upload-window: events::publish ─▶ bucket
//! <session>/logs/export_events/*.log ──▶ events::export_tailer ─────────▶ events::spool
//! <session>/logs/**  ──────────────────▶ logs (watch, rescan, ledger, schedule) ─────────▶ bucket
//! head only: the dashboard's REST answers ─▶ dashboard (poller) ─────────────────────────▶ bucket
//! bucket ──▶ reader (discover, walk, read, decode, extract, model, report) ──▶ inspect (render) ──▶ a person
//! bucket ──▶ reader (its bucket door, discovery and fold) ──▶ serve ──HTTP, KubeRay's API──▶ a client
//! ```
//!
//! In the order data meets them:
//!
//! - [`cli`] and [`settings`]: flags and environment, all read and checked before anything
//!   starts; [`app`] starts the paths and shuts them down in one documented order.
//! - [`node`]: which Ray session is active and which node this is (the `<node>` of every key).
//! - [`events`]: the event path, from Ray's HTTP request to the uploaded object, with its
//!   quarantine, deduplication, fsync'd spool and uploader, and the publisher that grows each
//!   open segment's object within the upload window; also Ray's file-based export events.
//! - [`logs`]: live snapshots of the session logs (appended where the store can, else on a
//!   size-aware schedule), rotations, earlier sessions, final flush.
//! - [`dashboard`]: head only, snapshots of the dashboard endpoints the history server replays.
//! - [`contract`]: every object key and key parser of KubeRay's bucket layout; nothing else
//!   builds a key.
//! - [`storage`]: the object store backends (file, S3, GCS, Azure), streamed uploads, appends.
//! - [`reader`]: the read side, a bucket turned into a session model, shared by `inspect` and
//!   `serve`: bounded parallel reads of an untrusted bucket, both collectors' layouts, one fold.
//! - [`inspect`]: the command's face over the reader, a post-mortem report from a bucket.
//! - [`serve`]: the read side over HTTP, with KubeRay's history-server routes and Ray's dashboard
//!   and, with `--dashboard-dir`, Ray's own dashboard frontend on a dead session.
//! - [`metrics`]: the Prometheus names and the one place they are emitted from.
//! - [`util`]: helpers shared by several paths (time formats, atomic files, watching, memory,
//!   a bandwidth cap, escaping names from the bucket).
//!
//! `docs/ARCHITECTURE.md` walks the same map with the invariants and "start reading here".

pub mod app;
pub mod cli;
pub mod contract;
pub mod dashboard;
pub mod events;
pub mod inspect;
pub mod logs;
pub mod metrics;
pub mod node;
pub mod reader;
pub mod serve;
pub mod settings;
pub mod storage;
pub mod util;

pub use app::{run, Exit};
