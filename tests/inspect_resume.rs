//! The reader takes up an event object whose body broke off mid-stream from the byte it
//! reached (issue 36, review r54r), through the binary: `inspect --json` on moto's S3
//! behind the fault proxy, whose [`Fault::CutBody`] closes the connection after part of a
//! GET's body. object_store's client retries a broken body itself (twice, from the byte it
//! reached); the reader's own resumption covers what is left of its budget of tries.
//!
//! - cut once, and cut three times (past the client's own two retries): read whole, 0
//!   unreadable, every event;
//! - the object replaced while its body was cut off: unreadable, saying it changed, never
//!   a mix of the two versions;
//! - every GET of it cut: unreadable, saying how many times it was tried and at which byte;
//! - a resumed answer whose body is longer or shorter than its range: unreadable.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use rhc_testkit::collector::collector_bin;
use rhc_testkit::fault_proxy::{Fault, FaultProxy, Rule};
use rhc_testkit::services::{run_with_timeout, MotoS3};

const SESSION: &str = "session_2026-11-22_02-06-36_260774_21819";
const NODE: &str = "3ae6595c248ad7def1c7206bfd50b18e860d5eb167e4e068c64823a5";
const PREFIX: &str = "cluster-history/raycluster/default/c1";
const MARKERS: &str = "cluster-metadata/raycluster/default_c1";
const BUCKET: &str = "resume";
const TYPE: &str = "RESUME_FILLER";
/// Events in the object: about 320 KB, cut at [`CUT_AT`] bytes of each answer (a few cuts
/// do not reach its end), or at [`CUT_SHORT`] when every answer is cut.
const EVENTS: usize = 4000;
const CUT_AT: usize = 100_000;
const CUT_SHORT: usize = 1000;

fn object_key() -> String {
    format!("{PREFIX}/{SESSION}/{NODE}/node_events/{NODE}-2026-11-22-02-1.jsonl")
}

/// `events` lines whose ids begin with `tag`.
fn object_bytes(tag: &str, events: usize) -> Vec<u8> {
    (0..events)
        .map(|i| {
            format!(
                "{{\"eventId\":\"{tag}-{i:06}\",\"eventType\":\"{TYPE}\",\
                 \"timestamp\":\"2026-11-22T02:00:00Z\"}}\n"
            )
        })
        .collect::<String>()
        .into_bytes()
}

/// moto with the session (its marker and one event object), and the proxy in front of it.
fn rig() -> Option<(MotoS3, FaultProxy)> {
    let s3 = MotoS3::start()?;
    s3.create_bucket(BUCKET);
    s3.put_object(BUCKET, &format!("{MARKERS}/{SESSION}"), b"");
    s3.put_object(BUCKET, &object_key(), &object_bytes("v1", EVENTS));
    let proxy = FaultProxy::start(&format!("127.0.0.1:{}", s3.port)).expect("fault proxy");
    Some((s3, proxy))
}

/// A rule cutting GETs of the event object after `at` body bytes, holding `hold`.
fn cut(at: usize, hold: Duration) -> Rule {
    Rule::new(Fault::CutBody(at, hold))
        .method("GET")
        .target_contains(".jsonl")
}

/// `inspect s3://BUCKET --session SESSION --json` through the proxy.
fn inspect(proxy: &FaultProxy) -> Value {
    let url = proxy.url();
    let mut cmd = Command::new(collector_bin());
    cmd.args(["inspect", &format!("s3://{BUCKET}"), "--session", SESSION])
        .arg("--json")
        .env_remove("STORAGE_ROOT_DIR")
        .env("AWS_ENDPOINT", &url)
        .env("AWS_ALLOW_HTTP", "true")
        .env("AWS_ACCESS_KEY_ID", MotoS3::ACCESS_KEY_ID)
        .env("AWS_SECRET_ACCESS_KEY", MotoS3::SECRET_ACCESS_KEY)
        .env("AWS_REGION", MotoS3::REGION)
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env("no_proxy", "127.0.0.1,localhost");
    let out = run_with_timeout(&mut cmd, Duration::from_secs(60));
    assert!(
        out.status.success(),
        "{}\nstderr: {}",
        out.status,
        out.stderr
    );
    serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("no JSON ({e}):\n{}", out.stdout))
}

/// GETs of the event object the proxy cut.
fn cuts(proxy: &FaultProxy) -> usize {
    proxy
        .seen()
        .iter()
        .filter(|r| r.method == "GET" && r.target.contains(".jsonl") && r.faulted)
        .count()
}

fn assert_read_whole(r: &Value) {
    assert_eq!(r["problems"]["unreadable_objects"], 0, "{}", r["problems"]);
    assert_eq!(r["objects"]["read"], 1, "{}", r["objects"]);
    assert_eq!(
        r["events"]["by_type"][TYPE], EVENTS as u64,
        "{}",
        r["events"]
    );
    assert_eq!(r["problems"]["bad_lines"], 0, "{}", r["problems"]);
    // Every byte of the object counted once, those of a resumed answer included (review
    // r55e: a resumed body came out short in `objects.bytes_read`).
    assert_eq!(
        r["objects"]["bytes_read"],
        object_bytes("v1", EVENTS).len() as u64,
        "{}",
        r["objects"]
    );
}

fn unreadable_detail(r: &Value) -> String {
    assert_eq!(r["problems"]["unreadable_objects"], 1, "{}", r["problems"]);
    assert_eq!(r["objects"]["read"], 0, "{}", r["objects"]);
    r["problems"]["details"].to_string()
}

#[test]
fn a_body_cut_once_is_read_whole() {
    let Some((_s3, proxy)) = rig() else { return };
    proxy.add(cut(CUT_AT, Duration::ZERO).times(1));
    let r = inspect(&proxy);
    assert_eq!(cuts(&proxy), 1);
    assert_read_whole(&r);
}

/// Three cuts: object_store's client takes up the body twice itself, then gives up; the
/// reader takes it up from the byte it reached (an unreadable object before issue 36).
#[test]
fn a_body_cut_past_the_clients_own_retries_is_resumed_and_read_whole() {
    let Some((_s3, proxy)) = rig() else { return };
    proxy.add(cut(CUT_AT, Duration::ZERO).times(3));
    let r = inspect(&proxy);
    assert_eq!(cuts(&proxy), 3);
    assert_read_whole(&r);
    // Taken up from where it stopped, on the same version.
    let resumed: Vec<_> = proxy
        .seen()
        .into_iter()
        .filter(|q| q.method == "GET" && q.header("if-match").is_some())
        .collect();
    assert!(!resumed.is_empty(), "{:?}", proxy.seen());
    for q in &resumed {
        let range = q.header("range").unwrap_or_default();
        assert!(range.starts_with("bytes=") && range.ends_with('-'), "{q:?}");
        assert_ne!(range, "bytes=0-", "{q:?}");
    }
}

/// The object replaced while its first answer is cut off: the resumption's If-Match is
/// refused, and the object is unreadable with a message that says it changed (never a
/// first part of one version followed by the rest of another).
#[test]
fn an_object_replaced_between_the_cut_and_the_resumption_is_not_stitched() {
    let Some((s3, proxy)) = rig() else { return };
    proxy.add(cut(CUT_AT, Duration::from_millis(1500)).times(1));
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let until = Instant::now() + Duration::from_secs(30);
            while cuts(&proxy) == 0 && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(20));
            }
            // Straight to moto, while the cut connection is held.
            s3.put_object(BUCKET, &object_key(), &object_bytes("v2", EVENTS + 10));
        });
        let r = inspect(&proxy);
        let details = unreadable_detail(&r);
        assert!(details.contains("changed while being read"), "{details}");
        // Nothing of the second version was folded in.
        let v2 = r["events"]["by_type"][TYPE].as_u64().unwrap_or(0);
        assert!(v2 < EVENTS as u64, "{}", r["events"]);
    });
}

/// Every GET of the object cut: unreadable after the reader's budget of tries, saying how
/// many and at which byte.
#[test]
fn a_body_cut_every_time_is_unreadable_saying_how_often_it_was_tried() {
    let Some((_s3, proxy)) = rig() else { return };
    proxy.add(cut(CUT_SHORT, Duration::ZERO));
    let r = inspect(&proxy);
    let details = unreadable_detail(&r);
    assert!(details.contains("tried 4 times"), "{details}");
    assert!(details.contains("at byte "), "{details}");
}

/// A server that ignores `Range` and answers the reader's resumption 200 with the whole
/// object (after three cuts: the client's own two ranged retries were cut too): object_store
/// refuses the answer (not the 206 asked for), and so does the reader, at once (trying again
/// would get the same answer): unreadable, not the object's start stitched to the whole
/// object again.
#[test]
fn a_resumption_answered_with_the_whole_object_is_not_stitched() {
    let Some((_s3, proxy)) = rig() else { return };
    proxy.add(cut(CUT_AT / 4, Duration::ZERO).times(3));
    proxy.add(
        Rule::new(Fault::StripRequestHeader("range".into()))
            .method("GET")
            .target_contains(".jsonl")
            .with_header("range"),
    );
    let r = inspect(&proxy);
    let details = unreadable_detail(&r);
    assert!(details.contains("non-partial response"), "{details}");
    // The client's own two retries and one resumption of the reader's, no more.
    let ranged = proxy
        .seen()
        .iter()
        .filter(|q| q.method == "GET" && q.header("range").is_some())
        .count();
    assert_eq!(ranged, 3, "{:?}", proxy.seen());
}

/// `answer` (an HTTP/1.1 answer with a `Content-Length`) with its body changed by `change`
/// and its `Content-Length` set to the new body's: an answer whose length agrees with
/// itself but not with the `Content-Range` it carries.
fn with_body(answer: &[u8], change: impl Fn(&mut Vec<u8>)) -> Vec<u8> {
    let end = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("an answer head")
        + 4;
    let mut body = answer[end..].to_vec();
    change(&mut body);
    let head = String::from_utf8_lossy(&answer[..end]);
    let mut out = String::new();
    for line in head.split("\r\n") {
        if line.to_ascii_lowercase().starts_with("content-length:") {
            out.push_str(&format!("Content-Length: {}\r\n", body.len()));
        } else if !line.is_empty() {
            out.push_str(line);
            out.push_str("\r\n");
        }
    }
    out.push_str("\r\n");
    let mut out = out.into_bytes();
    out.extend_from_slice(&body);
    out
}

fn one_more_event(answer: &[u8]) -> Vec<u8> {
    with_body(answer, |b| b.extend_from_slice(&object_bytes("extra", 1)))
}

fn ten_bytes_short(answer: &[u8]) -> Vec<u8> {
    with_body(answer, |b| b.truncate(b.len().saturating_sub(10)))
}

/// The reader's resumption answered with a 206 of the right `Content-Range` whose body is
/// longer or shorter than that range (review r54t D1: one event too many, or a line lost,
/// and the object counted read): unreadable, saying so; no byte past the object's size
/// reaches the decoder.
#[test]
fn a_resumption_whose_body_disagrees_with_its_range_is_unreadable() {
    for (rewrite, says) in [
        (
            one_more_event as fn(&[u8]) -> Vec<u8>,
            "sent more than the object's",
        ),
        (ten_bytes_short, "the body ended at byte"),
    ] {
        let Some((_s3, proxy)) = rig() else { return };
        proxy.add(
            Rule::new(Fault::Rewrite(rewrite))
                .method("GET")
                .target_contains(".jsonl")
                .with_header("if-match"),
        );
        proxy.add(cut(CUT_AT, Duration::ZERO).times(3));
        let r = inspect(&proxy);
        let details = unreadable_detail(&r);
        assert!(details.contains(says), "{details}");
        let events = r["events"]["by_type"][TYPE].as_u64().unwrap_or(0);
        assert!(events < EVENTS as u64, "{}", r["events"]);
    }
}

/// `serve` stopped (SIGTERM) while a session's load waits on a body that stalled mid-object:
/// the load is given up, the request waiting for it is answered 503 with `Retry-After`, the
/// process exits 0 at once, and no thread panics (review r54t D2:
/// the load's HTTP timer was polled on a runtime being shut down: "A Tokio 1.x context was
/// found, but it is being shutdown").
#[test]
fn serve_stopped_during_a_stalled_load_exits_cleanly() {
    use rhc_testkit::serve::{cookie_header, set_cookies, Serve};
    let Some((_s3, proxy)) = rig() else { return };
    proxy.add(cut(CUT_AT, Duration::from_secs(60)).times(1));
    let dir = tempfile::tempdir().expect("temp dir");
    let url = proxy.url();
    let mut serve = Serve::start(
        &format!("s3://{BUCKET}"),
        &dir.path().join("serve.log"),
        &[],
        &[
            ("AWS_ENDPOINT", url.as_str()),
            ("AWS_ALLOW_HTTP", "true"),
            ("AWS_ACCESS_KEY_ID", MotoS3::ACCESS_KEY_ID),
            ("AWS_SECRET_ACCESS_KEY", MotoS3::SECRET_ACCESS_KEY),
            ("AWS_REGION", MotoS3::REGION),
            ("NO_PROXY", "127.0.0.1,localhost"),
            ("no_proxy", "127.0.0.1,localhost"),
        ],
    );
    let entered = serve
        .get(
            &format!("/enter_cluster/default/raycluster/c1/{SESSION}"),
            &[],
        )
        .expect("enter_cluster");
    assert_eq!(entered.status, 200, "{}", serve.log_text());
    let cookies = set_cookies(&entered);
    // The load starts and stalls on the held body; its request waits for it, on a thread of
    // its own (the server closes it at the stop).
    let (port, cookie) = (serve.port, cookie_header(&cookies));
    let waiting = std::thread::spawn(move || {
        rhc_testkit::http::try_http_request(
            "GET",
            &format!("http://127.0.0.1:{port}/api/v0/tasks?limit=1"),
            &[("Cookie", cookie.as_str())],
            b"",
        )
    });
    let until = Instant::now() + Duration::from_secs(20);
    while cuts(&proxy) == 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
    }
    // The stalled body is being waited on.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(cuts(&proxy), 1, "{:?}", proxy.seen());
    let (status, took) = serve.terminate(Duration::from_secs(10)).expect("exit");
    let log = serve.log_text();
    assert!(status.success(), "{status}\n{log}");
    assert!(!log.contains("panicked"), "{log}");
    assert!(took < Duration::from_secs(8), "{took:?}\n{log}");
    // The waiting request is told to ask again (review r54u D1: it got a 500).
    let answer = waiting
        .join()
        .expect("the waiting request")
        .expect("an answer");
    assert_eq!(
        answer.status,
        503,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    assert!(
        answer.header("retry-after").is_some(),
        "{:?}",
        answer.headers
    );
}
