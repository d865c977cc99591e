//! The state of conditional writes for the whole process: whether the store in use takes
//! them, whether one was refused, and the bookkeeping of 400 / 403 refusals that decides when
//! a refused write is sent once without its condition (the policy and its reasons:
//! `storage::versioned`'s module doc).
//!
//! Both writers of conditional requests read and report here: `versioned` (single PUTs of
//! grown event objects) and `append` (S3 completions carrying a condition). Keeping the state
//! in this leaf lets neither import the other for it. Guarantees: once conditions are turned
//! off ([`refuse_conditions`]) they stay off for the process, warned once; a refused write is
//! sent without its condition only when the same write (its key) was refused with its
//! condition on [`REFUSALS_TO_SWITCH`] attempts spanning [`REFUSAL_SPAN`], with no
//! conditional PUT landing and no refused write landing with its condition since the
//! refusals began (either shows the refusals were not the condition's and ends them), or,
//! once the process is shutting down ([`shutting_down`]), at its first refusal when no
//! conditional write has landed in the whole run (the span must not outlast the deadline).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Set once the store refused a condition ([`refuse_conditions`]).
static REFUSED: AtomicBool = AtomicBool::new(false);

/// Set by the publisher of a store that takes conditions (not `file://`, whose versions are
/// renamed into place by one process and need none).
static IN_USE: AtomicBool = AtomicBool::new(false);

/// Set once a write carrying its condition landed in this run where the store showed it
/// does not refuse the condition: a conditional PUT, or a write (of any kind) refused
/// before that landed with its condition ([`condition_taken`], [`condition_landed`]).
static TAKEN: AtomicBool = AtomicBool::new(false);

/// Set when the process begins to shut down ([`shutting_down`]).
static SHUTTING_DOWN: AtomicBool = AtomicBool::new(false);

/// The writes answered 400 / 403 with their condition since the refusals began (since the
/// last conditional PUT landed, or a refused write landed with its condition): each key with
/// when it was first refused and how many times.
static REFUSALS: Mutex<BTreeMap<String, (Instant, u32)>> = Mutex::new(BTreeMap::new());

/// So many 400 / 403 answers to the same write (its key) carrying its condition
/// ([`condition_refused`]), over at least [`REFUSAL_SPAN`], with no conditional PUT landing
/// and no refused write landing with its condition meanwhile, before that write is sent
/// without its condition to tell whether the store refuses the condition: one 400 or 403,
/// or a burst of them, may be the requests' own (a permission or key still propagating, a
/// gateway's hiccup), and turning conditions off for it let a late write replace a newer
/// version (reviews r35p D1: 100 of 300 acknowledged events lost after one passing 403; r35q
/// Q1: a 1.5 s hiccup refused three partitions' writes at once). Until then no write goes
/// without its condition (r35q Q2: a twin sent at once could itself be the late write): the
/// refused write fails and is tried again at the next round.
///
/// Counted per write, not over all writes: refusals are only seen when writes happen, so
/// two passing hiccups far apart, each refusing other writes whose retries landed, must not
/// add up to "refused for long" (review r41s D2: two 403s to log completions 31 s apart,
/// every retry landing with its condition, turned conditions off and a late PUT then lost
/// 100 of 300 events). Only the same write refused again at each of its retries shows a
/// refusal that lasts; with `--upload-window` up to an hour (a failed growth is retried
/// half a window later) that takes as long as its retries do, about a window.
pub const REFUSALS_TO_SWITCH: u32 = 3;

/// The least time the refusals of one write must span (see [`REFUSALS_TO_SWITCH`]). A store
/// that does not take the condition refuses it every time; its first objects are delayed
/// this long (or, with a long `--upload-window`, until the third attempt of a write), once
/// per run; a shutdown does not wait for it ([`shutting_down`]).
pub const REFUSAL_SPAN: Duration = Duration::from_secs(30);

/// Whether writes are still sent with their condition (false once the store refused one).
pub fn conditions_on() -> bool {
    !REFUSED.load(Ordering::SeqCst)
}

/// The publisher's store takes conditions: [`conditional_writes_now`] says 1 until one is
/// refused.
pub fn conditions_in_use() {
    IN_USE.store(true, Ordering::SeqCst);
}

/// Whether event objects are written conditionally now (`rhc_event_conditional_writes`, read
/// at each scrape, so a refusal by the log lane's completions shows at once: review r35p D2).
pub fn conditional_writes_now() -> bool {
    IN_USE.load(Ordering::SeqCst) && conditions_on()
}

/// The process is shutting down (SIGTERM / SIGINT, before the seal): from now on, while no
/// conditional write has landed in this run, a write refused with its condition is sent
/// without it at once instead of after [`REFUSAL_SPAN`], which would outlast the shutdown
/// deadline (review r41s D3: a store refusing every conditional PUT and a SIGTERM 1 s after
/// start left every event in the spool, exit 3, and a pod's spool goes with the pod).
/// Conditions still turn off only if that write lands.
pub fn shutting_down() {
    SHUTTING_DOWN.store(true, Ordering::SeqCst);
}

/// A conditional PUT landed: the store takes conditions, refusals before it were passing.
/// (A completion is [`condition_landed`]: moto, and perhaps other stores, ignore the
/// condition there.)
pub fn condition_taken() {
    TAKEN.store(true, Ordering::SeqCst);
    forget_refusals();
}

/// A write carrying its condition to `key` landed, of a kind the store may not check (a
/// completion): when a write to `key` was refused with its condition since the refusals
/// began, that refusal was not the condition's (the same condition now passed), and the
/// refusals end (review r41s D2). A key never refused proves nothing here.
pub fn condition_landed(key: &str) {
    let mut refusals = REFUSALS.lock().unwrap_or_else(|p| p.into_inner());
    if refusals.remove(key).is_some() {
        tracing::info!(%key, "a write refused with its condition (400 / 403) landed with it when tried again: the refusals were passing, conditions stay on");
        refusals.clear();
        TAKEN.store(true, Ordering::SeqCst);
    }
}

/// A write to `key` carrying a condition was answered 400 / 403 (`status`, S3's `code`;
/// `why`: the whole answer). True when the refusals of that write have lasted long enough
/// ([`REFUSALS_TO_SWITCH`], [`REFUSAL_SPAN`]), or at shutdown when no conditional write has
/// landed in this run ([`shutting_down`]), that the caller should send the same write
/// without its condition, and turn conditions off ([`refuse_conditions`]) if that lands;
/// false otherwise: the write fails, with its condition kept, and is tried again later.
pub fn condition_refused(key: &str, status: Option<u16>, code: Option<&str>, why: &str) -> bool {
    let now = Instant::now();
    let mut refusals = REFUSALS.lock().unwrap_or_else(|p| p.into_inner());
    let (first, n) = refusals.entry(key.to_string()).or_insert((now, 0));
    *n += 1;
    let (first, n) = (*first, *n);
    let lasted = n >= REFUSALS_TO_SWITCH && now.duration_since(first) >= REFUSAL_SPAN;
    let at_shutdown = SHUTTING_DOWN.load(Ordering::SeqCst) && !TAKEN.load(Ordering::SeqCst);
    if !lasted && !at_shutdown {
        tracing::warn!(
            %key,
            status = status.unwrap_or(0),
            code = code.unwrap_or("no error code"),
            answer = why,
            refusals = n,
            "a write carrying its condition was refused (400 / 403); it is tried again with its condition. If this write is refused for {}s (and {} times) with no conditional write landing, it is sent once without its condition, to tell whether the store refuses the condition",
            REFUSAL_SPAN.as_secs(),
            REFUSALS_TO_SWITCH
        );
    } else if !lasted {
        tracing::warn!(
            %key,
            status = status.unwrap_or(0),
            code = code.unwrap_or("no error code"),
            answer = why,
            "a write carrying its condition was refused (400 / 403) during the shutdown, and no conditional write has landed in this run: sent once without its condition at once, not after {}s (which would outlast the shutdown deadline); conditions turn off only if it lands",
            REFUSAL_SPAN.as_secs()
        );
    }
    lasted || at_shutdown
}

/// The write sent without its condition after decisive refusals was refused too: the
/// refusals were the writes' own (credentials, a bad request), not the condition's; the
/// count starts again.
pub fn refusal_was_the_writes() {
    forget_refusals();
}

/// The refusals counted so far say nothing more: the count starts again at the next one.
fn forget_refusals() {
    REFUSALS.lock().unwrap_or_else(|p| p.into_inner()).clear();
}

/// The store does not take conditional writes: it answered a write carrying one with
/// `status` and S3's error `code` (`why`: the whole answer). Every write from now on is sent
/// without a condition, as before; warned once.
pub fn refuse_conditions(status: Option<u16>, code: Option<&str>, why: &str) {
    if !REFUSED.swap(true, Ordering::SeqCst) {
        let status = status.map_or_else(|| "?".to_string(), |s| s.to_string());
        let code = code.unwrap_or("no error code");
        tracing::warn!(
            %status,
            code,
            answer = why,
            "the store does not take conditional writes (a write carrying If-Match / If-None-Match was answered {status} {code}): event objects are written unconditionally from now on, so a growth delivered late (a killed run's, or one that timed out) can replace a newer version; see docs/guarantees.md"
        );
    }
}
