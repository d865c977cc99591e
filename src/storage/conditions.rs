//! The state of conditional writes for the whole process: whether the store in use takes
//! them, whether one was refused, and the bookkeeping of 400 / 403 refusals that decides when
//! a refused write is sent once without its condition (the policy and its reasons:
//! `storage::versioned`'s module doc).
//!
//! Both writers of conditional requests read and report here: `versioned` (single PUTs of
//! grown event objects) and `append` (S3 completions carrying a condition). Keeping the state
//! in this leaf lets neither import the other for it. Guarantees: once conditions are turned
//! off ([`refuse_conditions`]) they stay off for the process, warned once; a refused write is
//! sent without its condition only after [`REFUSALS_TO_SWITCH`] refusals spanning
//! [`REFUSAL_SPAN`] with no conditional write landing between them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Set once the store refused a condition ([`refuse_conditions`]).
static REFUSED: AtomicBool = AtomicBool::new(false);

/// Set by the publisher of a store that takes conditions (not `file://`, whose versions are
/// renamed into place by one process and need none).
static IN_USE: AtomicBool = AtomicBool::new(false);

/// The 400 / 403 answers to conditional writes since the last conditional write landed:
/// when the first came, and how many.
static REFUSALS: Mutex<Option<(Instant, u32)>> = Mutex::new(None);

/// So many 400 / 403 answers to conditional writes ([`condition_refused`]), over at least
/// [`REFUSAL_SPAN`], with no conditional write landing between them, before the same write
/// is sent without its condition to tell whether the store refuses the condition: one 400
/// or 403, or a burst of them, may be the requests' own (a permission or key still
/// propagating, a gateway's hiccup), and turning conditions off for it let a late write
/// replace a newer version (reviews r35p D1: 100 of 300 acknowledged events lost after one
/// passing 403; r35q Q1: a 1.5 s hiccup refused three partitions' writes at once). Until
/// then no write goes without its condition (r35q Q2: a twin sent at once could itself be
/// the late write): the refused write fails and is tried again at the next round.
pub const REFUSALS_TO_SWITCH: u32 = 3;

/// The least time the refusals must span (see [`REFUSALS_TO_SWITCH`]). A store that does not
/// take the condition refuses it every time; its first objects are delayed this long, once
/// per run.
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

/// A conditional PUT landed: the store takes conditions, refusals before it were passing.
/// (Not a completion: moto, and perhaps other stores, ignore the condition there.)
pub fn condition_taken() {
    forget_refusals();
}

/// A write carrying a condition was answered 400 / 403 (`status`, S3's `code`; `why`: the
/// whole answer). True when the refusals have lasted long enough ([`REFUSALS_TO_SWITCH`],
/// [`REFUSAL_SPAN`]) that the caller should send the same write without its condition, and
/// turn conditions off ([`refuse_conditions`]) if that lands; false otherwise: the write
/// fails, with its condition kept, and is tried again later.
pub fn condition_refused(status: Option<u16>, code: Option<&str>, why: &str) -> bool {
    let now = Instant::now();
    let mut refusals = REFUSALS.lock().unwrap_or_else(|p| p.into_inner());
    let (first, n) = refusals.get_or_insert((now, 0));
    *n += 1;
    let (first, n) = (*first, *n);
    let decisive = n >= REFUSALS_TO_SWITCH && now.duration_since(first) >= REFUSAL_SPAN;
    if !decisive {
        tracing::warn!(
            status = status.unwrap_or(0),
            code = code.unwrap_or("no error code"),
            answer = why,
            refusals = n,
            "a write carrying its condition was refused (400 / 403); it is tried again with its condition. If refusals go on for {}s with no conditional write landing, the write is sent once without its condition, to tell whether the store refuses the condition",
            REFUSAL_SPAN.as_secs()
        );
    }
    decisive
}

/// The write sent without its condition after decisive refusals was refused too: the
/// refusals were the writes' own (credentials, a bad request), not the condition's; the
/// count starts again.
pub fn refusal_was_the_writes() {
    forget_refusals();
}

/// The refusals counted so far say nothing more: the count starts again at the next one.
fn forget_refusals() {
    *REFUSALS.lock().unwrap_or_else(|p| p.into_inner()) = None;
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
