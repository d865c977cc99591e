//! The state of conditional writes for the whole process, per kind of condition ([`Kind`]: a
//! PUT or a multipart completion, carrying `If-None-Match: *` or `If-Match`): whether the
//! store in use takes them, which kinds it refused, and the bookkeeping of 400 / 403
//! refusals that decides when a refused write is sent once without its condition (the
//! policy and its reasons: `storage::versioned`'s module doc).
//!
//! Both writers of conditional requests read and report here: `versioned` (single PUTs of
//! grown event objects) and `append` (S3 completions carrying a condition). Keeping the state
//! in this leaf lets neither import the other for it.
//!
//! Guarantees:
//! - Each kind is counted, cleared and turned off on its own: a write of one kind landing
//!   with its condition says nothing about another kind's refusals (review r35r C1: a store
//!   refusing the condition on completions only, taking it on PUTs, had every landed PUT
//!   clear the completions' refusals; they never lasted, the big partition never reached
//!   the bucket and SIGTERM exited 3; C2: the same with `If-Match` refused, creates taken).
//! - A refused write is sent without its condition only when the same write (its key) was
//!   refused with a condition of its kind on [`REFUSALS_TO_SWITCH`] attempts spanning
//!   [`REFUSAL_SPAN`], with no write of that kind landing with its condition since the
//!   refusals began (a landing shows the refusals were not the condition's and ends them);
//!   or, once the process is shutting down ([`shutting_down`]) and no write of that kind
//!   has landed with its condition in the run, when the same write was refused on
//!   [`REFUSALS_TO_SWITCH`] attempts, the later ones tried again at once after
//!   [`SHUTDOWN_RETRY_PAUSE`] (one passing refusal at shutdown is tried again with its
//!   condition, never answered by a twin without it: review r35r S2).
//! - Once that write without its condition lands, its kind is turned off
//!   ([`refuse_conditions`]), and with it every kind that has not landed with its condition
//!   in this run (a store that refuses one condition mostly refuses them all; a kind it has
//!   shown it takes stays on). Off stays off for the process, warned once per turn.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// A kind of conditional write: the request and the header that carries its condition.
/// Counted, cleared and turned off on its own (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A PUT with `If-None-Match: *` (an object's first version).
    PutCreate,
    /// A PUT with `If-Match` (GCS: the generation): a new version of an object.
    PutReplace,
    /// An S3 `CompleteMultipartUpload` with `If-None-Match: *`.
    CompleteCreate,
    /// An S3 `CompleteMultipartUpload` with `If-Match` (event and log appends, big versions).
    CompleteReplace,
}

impl Kind {
    /// Every kind, in the order of [`Kind::index`].
    pub const ALL: [Kind; 4] = [
        Kind::PutCreate,
        Kind::PutReplace,
        Kind::CompleteCreate,
        Kind::CompleteReplace,
    ];

    /// The kind's name, as logs and the `kind` label of `rhc_conditional_writes_refused`
    /// say it.
    pub fn name(self) -> &'static str {
        match self {
            Kind::PutCreate => "put_if_none_match",
            Kind::PutReplace => "put_if_match",
            Kind::CompleteCreate => "complete_if_none_match",
            Kind::CompleteReplace => "complete_if_match",
        }
    }

    /// A PUT's kind: `create` for `If-None-Match: *`.
    pub fn put(create: bool) -> Kind {
        if create {
            Kind::PutCreate
        } else {
            Kind::PutReplace
        }
    }

    /// A completion's kind: `create` for `If-None-Match: *`.
    pub fn completion(create: bool) -> Kind {
        if create {
            Kind::CompleteCreate
        } else {
            Kind::CompleteReplace
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// One kind's state.
struct PerKind {
    /// The store refused this kind: its writes go without the condition.
    refused: bool,
    /// A write of this kind landed with its condition in this run.
    taken: bool,
    /// The writes of this kind answered 400 / 403 with their condition since the refusals
    /// began (since a write of this kind last landed with its condition): each key with
    /// when it was first refused and how many times.
    refusals: BTreeMap<String, (Instant, u32)>,
}

impl PerKind {
    const fn new() -> PerKind {
        PerKind {
            refused: false,
            taken: false,
            refusals: BTreeMap::new(),
        }
    }
}

static KINDS: Mutex<[PerKind; 4]> = Mutex::new([
    PerKind::new(),
    PerKind::new(),
    PerKind::new(),
    PerKind::new(),
]);

fn kinds() -> MutexGuard<'static, [PerKind; 4]> {
    KINDS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Set by the publisher of a store that takes conditions (not `file://`, whose versions are
/// renamed into place by one process and need none).
static IN_USE: AtomicBool = AtomicBool::new(false);

/// Set when the process begins to shut down ([`shutting_down`]).
static SHUTTING_DOWN: AtomicBool = AtomicBool::new(false);

/// So many 400 / 403 answers to the same write (its key) carrying a condition of its kind
/// ([`condition_refused`]), over at least [`REFUSAL_SPAN`], with no write of that kind
/// landing with its condition meanwhile, before that write is sent without its condition
/// to tell whether the store refuses the condition: one 400 or 403, or a burst of them, may
/// be the requests' own (a permission or key still propagating, a gateway's hiccup), and
/// turning conditions off for it let a late write replace a newer version (reviews r35p
/// D1: 100 of 300 acknowledged events lost after one passing 403; r35q Q1: a 1.5 s hiccup
/// refused three partitions' writes at once). Until then no write goes without its
/// condition (r35q Q2: a twin sent at once could itself be the late write): the refused
/// write fails and is tried again at the next round.
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
/// that does not take a kind of condition refuses it every time; the first objects written
/// with that kind are delayed this long (or, with a long `--upload-window`, until the third
/// attempt of a write), once per run; a shutdown does not wait for it ([`shutting_down`]).
pub const REFUSAL_SPAN: Duration = Duration::from_secs(30);

/// Test only: [`REFUSAL_SPAN`] in seconds, so the tests of a store that refuses conditions
/// (every one of them waits out the span) take seconds instead of half a minute each. Not a
/// setting: read once, and only a whole number of seconds from 1 to 30 is taken.
pub const TEST_REFUSAL_SPAN: &str = "RHC_TEST_CONDITION_REFUSAL_SPAN_SECS";

/// [`REFUSAL_SPAN`], or the span [`TEST_REFUSAL_SPAN`] sets.
pub fn refusal_span() -> Duration {
    static SPAN: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *SPAN.get_or_init(|| {
        std::env::var(TEST_REFUSAL_SPAN)
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|s| (1..=REFUSAL_SPAN.as_secs()).contains(s))
            .map_or(REFUSAL_SPAN, Duration::from_secs)
    })
}

/// At shutdown, the pause before a refused write is tried again with its condition
/// (see [`shutting_down`]): [`REFUSALS_TO_SWITCH`] refusals of the same write then span at
/// least twice this, so a single passing refusal, or one shorter than that, never has the
/// write sent without its condition, and the shutdown still ends well within the default
/// `--shutdown-timeout` (25 s) for a store refusing the condition.
pub const SHUTDOWN_RETRY_PAUSE: Duration = Duration::from_secs(1);

/// What to do with a write answered 400 / 403 with its condition ([`condition_refused`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Fail it, its condition kept: tried again at the next round.
    Fail,
    /// At shutdown: try the same write again with its condition after this pause.
    RetryAfter(Duration),
    /// Send the same write once without its condition; [`refuse_conditions`] if it lands,
    /// [`refusal_was_the_writes`] if it is refused too.
    SendWithout,
}

/// Whether writes of `kind` are still sent with their condition (false once the store
/// refused it, or refused another kind while this one had not landed with its condition).
pub fn conditions_on(kind: Kind) -> bool {
    !kinds()[kind.index()].refused
}

/// The publisher's store takes conditions: [`conditional_writes_now`] says 1 until a kind
/// is refused.
pub fn conditions_in_use() {
    IN_USE.store(true, Ordering::SeqCst);
}

/// Whether every write of event objects that can carry a condition carries it now
/// (`rhc_event_conditional_writes`, read at each scrape, so a refusal by the log lane's
/// completions shows at once: review r35p D2): false for `file://` and once any kind is
/// refused ([`kinds_refused`] says which).
pub fn conditional_writes_now() -> bool {
    IN_USE.load(Ordering::SeqCst) && kinds().iter().all(|k| !k.refused)
}

/// Each kind with whether the store refused it (its writes go without the condition):
/// `rhc_conditional_writes_refused{kind}`.
pub fn kinds_refused() -> [(&'static str, bool); 4] {
    let k = kinds();
    Kind::ALL.map(|kind| (kind.name(), k[kind.index()].refused))
}

/// The process is shutting down (SIGTERM / SIGINT, before the seal): from now on, a write
/// refused with a condition of a kind that has not landed with its condition in this run
/// is tried again with it after [`SHUTDOWN_RETRY_PAUSE`], and sent without it once the same
/// write was refused [`REFUSALS_TO_SWITCH`] times, instead of after [`REFUSAL_SPAN`], which
/// would outlast the shutdown deadline (review r41s D3: a store refusing every conditional
/// PUT and a SIGTERM 1 s after start left every event in the spool, exit 3, and a pod's
/// spool goes with the pod). One refusal is not enough (review r35r S2: a passing 403 at
/// shutdown had the twin sent at once; delayed 40 s, it replaced what the next run had
/// uploaded, 100 of 200 events lost). Conditions still turn off only if that write lands.
pub fn shutting_down() {
    // Refusals count again from here: only those of the shutdown's own tries decide a write
    // without its condition (review r35s D1: two 403s before the SIGTERM and one after it
    // sent the twin at once, which landed late and lost 100 of 200 events).
    let mut k = kinds();
    SHUTTING_DOWN.store(true, Ordering::SeqCst);
    for state in k.iter_mut() {
        state.refusals.clear();
    }
}

/// A write carrying a condition of `kind` landed (a PUT, or a completion: a store that
/// ignores the condition does not refuse it either): the store takes that kind, its
/// refusals before were passing and end. Other kinds' refusals stay.
pub fn condition_taken(kind: Kind) {
    let mut k = kinds();
    let state = &mut k[kind.index()];
    if !state.refusals.is_empty() {
        tracing::info!(
            kind = kind.name(),
            "a write carrying its condition landed: the refusals of this kind of condition were passing, it stays on"
        );
    }
    state.taken = true;
    state.refusals.clear();
}

/// A write to `key` carrying a condition of `kind` was answered 400 / 403 (`status`, S3's
/// `code`; `why`: the whole answer): what to do with it ([`Refused`], see the module doc).
pub fn condition_refused(
    kind: Kind,
    key: &str,
    status: Option<u16>,
    code: Option<&str>,
    why: &str,
) -> Refused {
    let now = Instant::now();
    let mut k = kinds();
    let state = &mut k[kind.index()];
    let (first, n) = state.refusals.entry(key.to_string()).or_insert((now, 0));
    *n += 1;
    let (first, n) = (*first, *n);
    let lasted = n >= REFUSALS_TO_SWITCH && now.duration_since(first) >= refusal_span();
    let at_shutdown = SHUTTING_DOWN.load(Ordering::SeqCst) && !state.taken;
    drop(k);
    let status = status.unwrap_or(0);
    let code = code.unwrap_or("no error code");
    if lasted {
        return Refused::SendWithout;
    }
    if at_shutdown && n >= REFUSALS_TO_SWITCH {
        tracing::warn!(
            %key, kind = kind.name(), status, code, answer = why, refusals = n,
            "a write carrying its condition was refused (400 / 403) again at each try during the shutdown, and no write of this kind has landed with its condition in this run: sent once without its condition now, not after {}s (which would outlast the shutdown deadline); conditions turn off only if it lands",
            refusal_span().as_secs()
        );
        return Refused::SendWithout;
    }
    if at_shutdown {
        tracing::warn!(
            %key, kind = kind.name(), status, code, answer = why, refusals = n,
            "a write carrying its condition was refused (400 / 403) during the shutdown: tried again with its condition in {}ms; sent once without it only if refused {} times",
            SHUTDOWN_RETRY_PAUSE.as_millis(),
            REFUSALS_TO_SWITCH
        );
        return Refused::RetryAfter(SHUTDOWN_RETRY_PAUSE);
    }
    tracing::warn!(
        %key, kind = kind.name(), status, code, answer = why, refusals = n,
        "a write carrying its condition was refused (400 / 403); it is tried again with its condition. If this write is refused for {}s (and {} times) with no write of this kind landing with its condition, it is sent once without its condition, to tell whether the store refuses the condition",
        refusal_span().as_secs(),
        REFUSALS_TO_SWITCH
    );
    Refused::Fail
}

/// The write of `kind` sent without its condition after decisive refusals was refused
/// too: the refusals were the writes' own (credentials, a bad request), not the
/// condition's; the count of that kind starts again.
pub fn refusal_was_the_writes(kind: Kind) {
    kinds()[kind.index()].refusals.clear();
}

/// The store does not take conditions of `kind`: it answered a write carrying one with
/// `status` and S3's error `code` (`why`: the whole answer), and the same write without it
/// landed (or the answer was 501 / `NotImplemented`). Writes of that kind, and of every
/// kind that has not landed with its condition in this run, are sent without a condition
/// from now on, as before; warned once for each turn.
pub fn refuse_conditions(kind: Kind, status: Option<u16>, code: Option<&str>, why: &str) {
    let mut k = kinds();
    let mut off = Vec::new();
    for other in Kind::ALL {
        let state = &mut k[other.index()];
        if state.refused || (other != kind && state.taken) {
            continue;
        }
        state.refused = true;
        state.refusals.clear();
        off.push(other.name());
    }
    let kept: Vec<&str> = Kind::ALL
        .iter()
        .filter(|o| !k[o.index()].refused)
        .map(|o| o.name())
        .collect();
    drop(k);
    if off.is_empty() {
        return;
    }
    let status = status.map_or_else(|| "?".to_string(), |s| s.to_string());
    let code = code.unwrap_or("no error code");
    tracing::warn!(
        %status,
        code,
        answer = why,
        refused = kind.name(),
        turned_off = ?off,
        still_conditional = ?kept,
        "the store does not take conditional writes of this kind (a write carrying {} was answered {status} {code}, and the same write without it landed): writes of the kinds turned_off (this one, and those that have not landed with their condition in this run) go unconditionally from now on, so a growth delivered late (a killed run's, or one that timed out) can replace a newer version; see docs/guarantees.md",
        match kind {
            Kind::PutCreate | Kind::CompleteCreate => "If-None-Match",
            Kind::PutReplace | Kind::CompleteReplace => "If-Match",
        }
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The state is process-wide: one test walks it through in order.
    #[test]
    fn kinds_are_counted_cleared_and_turned_off_on_their_own() {
        // Completions refused; PUTs landing with their condition clear nothing of theirs.
        condition_taken(Kind::PutCreate);
        condition_taken(Kind::PutReplace);
        assert_eq!(
            condition_refused(Kind::CompleteReplace, "k", Some(400), None, ""),
            Refused::Fail
        );
        condition_taken(Kind::PutReplace);
        assert_eq!(kinds()[Kind::CompleteReplace.index()].refusals.len(), 1);
        // A completion of that kind landing ends them.
        condition_taken(Kind::CompleteReplace);
        assert!(kinds()[Kind::CompleteReplace.index()].refusals.is_empty());
        // A refused kind turns off with those not taken; taken kinds stay on.
        refuse_conditions(Kind::CompleteCreate, Some(400), None, "");
        assert!(!conditions_on(Kind::CompleteCreate));
        assert!(conditions_on(Kind::CompleteReplace));
        assert!(conditions_on(Kind::PutCreate) && conditions_on(Kind::PutReplace));
        assert!(!conditional_writes_now());
        assert!(kinds_refused().contains(&("complete_if_none_match", true)));
        assert!(kinds_refused().contains(&("put_if_match", false)));
    }
}
