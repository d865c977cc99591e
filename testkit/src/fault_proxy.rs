//! A fault-injecting HTTP/1.1 reverse proxy on loopback, between the collector and a storage
//! emulator (moto): every request is recorded (method, target, headers, the answer's
//! status), and rules answer chosen requests with an error (a 503 burst, a 501 refusal,
//! a refused copy of one key), delay them (slow answers, or an error after a delay), pass
//! them on and answer an error anyway (a gateway's 504 after the store took it) or drop the
//! connection.
//!
//! A slow uplink: [`FaultProxy::slow_body_reads`] has the proxy read every request body at
//! a given rate, with a small receive buffer, so the client's bytes really trickle (the
//! client's request is slow but moving, as over a congested node uplink). The buffer is set
//! on the listening socket, so each connection has it from its handshake (see [`Brake`]).
//!
//! A store whose answers lack a header ([`Fault::StripAnswerHeader`]: HEADs without an
//! `ETag`), and, emulated, one that honours `x-amz-copy-source-if-match` on copies, which
//! moto ignores ([`Fault::EmulateCopyIfMatch`]).
//!
//! A connection dropped in the middle of an answer's body ([`Fault::CutBody`]), and a server
//! that ignores a request header ([`Fault::StripRequestHeader`]: `Range`).
//!
//! A store that answers before it read a body ([`Fault::Early`]), one that answers so and
//! then reads nothing ([`Fault::EarlyStall`]), and one that takes no byte of it
//! ([`Fault::Stall`]), are answered from the head alone.
//!
//! One request per connection: the request is read whole (head and `Content-Length` body),
//! sent to the target with `Connection: close`, and the target's answer is passed back as
//! it came, then the connection is closed. Every read has a timeout, bodies are bounded,
//! and the threads end when the proxy is dropped.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// Longest request head read.
const MAX_HEAD: usize = 64 << 10;
/// Largest request body passed on (the tests' parts are a few MiB).
const MAX_BODY: usize = 256 << 20;
/// Read and write timeout of every socket.
const IO_TIMEOUT: Duration = Duration::from_secs(60);

/// What a rule does to a matching request.
#[derive(Debug, Clone)]
pub enum Fault {
    /// Answers this status with an S3 error document of this code, without passing it on.
    Status(u16, String),
    /// Answers 200 with an S3 error document of this code (as S3 does when a copy or a
    /// completion fails after its answer began), without passing it on.
    ErrorIn200(String),
    /// Passes it on after this delay.
    Delay(Duration),
    /// Answers this status with an S3 error document of this code after this delay, without
    /// passing it on: a request that fails only after it has been in flight a while (a send
    /// still running at SIGTERM that then fails).
    DelayThenStatus(Duration, u16, String),
    /// Passes it on, throws the target's answer away and answers this status with an S3
    /// error document of this code: a gateway in front of the store (a load balancer, nginx)
    /// answering 502 or 504 after the store took the request.
    PassThenStatus(u16, String),
    /// Closes the connection without an answer, once the request was read whole (never
    /// passed on): a request that left the client, whose outcome the client cannot know.
    Drop,
    /// Holds the request this long (at most until the proxy is dropped) without passing it
    /// on, then closes the connection without an answer: a black hole towards the store, or
    /// a request the store never sees (a kill of the client while it is held leaves it undone).
    /// It is in [`FaultProxy::seen`] from the moment it arrives. [`MAX_HOLD`]: "never answered"
    /// within any test.
    Hold(Duration),
    /// Passes it on (the store does it), then holds the store's answer this long (at most
    /// until the proxy is dropped) and closes the connection without it: a request that
    /// landed while its client never learns so (a kill of the client while it is held).
    HoldAnswer(Duration),
    /// Answers this status with an S3 error document of this code as soon as the head is
    /// read, without passing it on and keeping the connection open (no `Connection:
    /// close`), then reads the body at this many bytes per second and closes: a store that
    /// answers before it read the body, while the client is still writing it (review r42k
    /// D1). While such a rule is pending, every connection gets a small receive buffer, so
    /// the body really trickles.
    Early(u16, String, u64),
    /// Answers as [`Fault::Early`] does, then reads no byte of the body and holds the
    /// connection this long (at most until the proxy is dropped) before it closes it: a
    /// store that answers 503 from the head and keeps the connection without reading it
    /// (review r39q D2). Every connection gets the small receive buffer while it is pending.
    EarlyStall(u16, String, Duration),
    /// Reads the head and nothing more, holds the connection this long (at most until the
    /// proxy is dropped), then closes it: a store that accepts a request and no byte of its
    /// body. It is in [`FaultProxy::seen`] from the moment it arrives.
    Stall(Duration),
    /// Passes it on and answers what the target answered without the header of this name
    /// (any case): a store whose HEAD answers carry no `ETag` (issue 42, review r42x).
    StripAnswerHeader(String),
    /// EMULATED, a last resort: a store that honours `x-amz-copy-source-if-match` on
    /// `UploadPartCopy`. moto ignores the header (its `upload_part_copy` never reads it)
    /// and no store that honours it could be installed here (s3s-fs ignores it too, MinIO
    /// and Ceph's gateway are not to be had), so the proxy does the check S3 does: it asks
    /// the target for the source's ETag (a HEAD, straight to it) and answers 412
    /// `PreconditionFailed` itself when the condition names another; otherwise it passes
    /// the copy on. A copy without the header passes on.
    EmulateCopyIfMatch,
    /// Passes it on and answers what this function makes of the store's whole answer (status
    /// line, head and body as received): an answer changed on its way (a store or gateway
    /// listing things otherwise than asked).
    Rewrite(fn(&[u8]) -> Vec<u8>),
    /// Passes it on, sends back the store's answer head and the first this many bytes of its
    /// body, holds the connection this long (at most until the proxy is dropped), then closes
    /// it: a connection dropped mid-body (issue 36). It is in [`FaultProxy::seen`] once the
    /// cut answer was sent, before the hold, so a test can change the store meanwhile.
    CutBody(usize, Duration),
    /// Passes it on without the request header of this name (any case), and answers what
    /// the target answered to that: a server that ignores `Range` and answers a resumption
    /// with the whole object (issue 36). [`FaultProxy::seen`] keeps the header as sent.
    StripRequestHeader(String),
}

/// The longest a [`Fault::Hold`] holds a request (the reproduction held copies for
/// 600 s; a test ends long before).
pub const MAX_HOLD: Duration = Duration::from_secs(600);

/// Which requests a fault applies to, and for how long.
#[derive(Debug, Clone)]
pub struct Rule {
    fault: Fault,
    method: Option<String>,
    target_contains: Option<String>,
    header: Option<String>,
    without: Option<String>,
    until: Option<Instant>,
    times: Option<usize>,
}

impl Rule {
    /// `fault` for every request, until narrowed.
    pub fn new(fault: Fault) -> Rule {
        Rule {
            fault,
            method: None,
            target_contains: None,
            header: None,
            without: None,
            until: None,
            times: None,
        }
    }

    /// Only requests with this method.
    pub fn method(mut self, m: &str) -> Rule {
        self.method = Some(m.to_ascii_uppercase());
        self
    }

    /// Only requests whose target (path and query) contains `s`.
    pub fn target_contains(mut self, s: &str) -> Rule {
        self.target_contains = Some(s.to_string());
        self
    }

    /// Only requests that carry the header `name` (`x-amz-copy-source`: UploadPartCopy).
    pub fn with_header(mut self, name: &str) -> Rule {
        self.header = Some(name.to_ascii_lowercase());
        self
    }

    /// Only requests that do not carry the header `name` (`x-amz-copy-source` on a PUT
    /// with `partNumber=`: UploadPart of new bytes, not a copy).
    pub fn without_header(mut self, name: &str) -> Rule {
        self.without = Some(name.to_ascii_lowercase());
        self
    }

    /// Only for `d` from now.
    pub fn for_time(mut self, d: Duration) -> Rule {
        self.until = Some(Instant::now() + d);
        self
    }

    /// Only the next `n` matching requests.
    pub fn times(mut self, n: usize) -> Rule {
        self.times = Some(n);
        self
    }

    fn matches(&self, req: &SeenRequest) -> bool {
        self.until.is_none_or(|u| Instant::now() < u)
            && self.times.is_none_or(|n| n > 0)
            && self.method.as_ref().is_none_or(|m| *m == req.method)
            && self
                .target_contains
                .as_ref()
                .is_none_or(|t| req.target.contains(t.as_str()))
            && self.header.as_ref().is_none_or(|h| req.header(h).is_some())
            && self
                .without
                .as_ref()
                .is_none_or(|h| req.header(h).is_none())
    }
}

/// A request the proxy saw.
#[derive(Debug, Clone)]
pub struct SeenRequest {
    /// `GET`, `PUT`, ...
    pub method: String,
    /// Path and query.
    pub target: String,
    /// Header names lower-cased, values as sent.
    pub headers: Vec<(String, String)>,
    /// The status answered (0: none).
    pub status: u16,
    /// Whether a rule answered it (or dropped it) instead of the target.
    pub faulted: bool,
}

impl SeenRequest {
    /// The value of header `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// An `UploadPartCopy`.
    pub fn is_copy(&self) -> bool {
        self.method == "PUT" && self.header("x-amz-copy-source").is_some()
    }
}

struct Shared {
    target: String,
    /// Where GCS's JSON API requests (`/storage/v1/...`, `/upload/storage/v1/...`) go
    /// instead of `target`, when set ([`FaultProxy::start_gcs`]).
    json_target: Option<String>,
    rules: Mutex<Vec<Rule>>,
    seen: Mutex<Vec<SeenRequest>>,
    /// Every request as it arrives (before any answer): method and target.
    arrived: Mutex<Vec<(String, String)>>,
    stop: AtomicBool,
    /// Bytes per second request bodies are read at (0: as fast as they come).
    body_rate: AtomicU64,
    /// The receive buffer of the connections to come.
    brake: Mutex<Brake>,
    /// Milliseconds a connection's thread waits before it begins (a loaded machine's
    /// scheduling, in this module's tests).
    late_ms: AtomicU64,
}

/// The receive buffer the connections accepted from now on get: [`SLOW_RECEIVE_BUFFER`]
/// while bodies are read slowly or a [`Fault::Early`] rule is pending, else the kernel's
/// default (autotuned until the first slow phase; its initial size after one).
///
/// It is set on the listening socket, which a connection takes its buffer from at its
/// handshake, as `tcp(7)` says it must be: Linux sizes the window it offers from the buffer
/// it has then. A buffer shrunk after the handshake, below the window already offered,
/// makes the kernel prune and drop what the client sent into that window, and the body then
/// comes mostly on the client's zero-window probes, a few hundred milliseconds apart: about
/// 160 kB/s whatever rate was asked. That happened on some connections only (a race with
/// the client's first bytes), more often on a loaded machine: a body to be read at 1 MB/s,
/// 3 MB, took 18 s, and a test whose body was to stop after 3 s saw it move until the
/// collector's shutdown deadline (review f55s).
struct Brake {
    /// The listening socket (a clone of the acceptor's), until the proxy is dropped.
    listener: Option<TcpListener>,
    /// Its buffer is [`SLOW_RECEIVE_BUFFER`] now.
    on: bool,
}

/// The receive buffer of a connection whose body is read slowly: small, so the client's
/// kernel cannot hand the whole body over at once and the client's send really trickles.
const SLOW_RECEIVE_BUFFER: libc::c_int = 16 << 10;
/// Bytes read at once from a slow body.
const SLOW_READ: usize = 4 << 10;

/// The proxy: `http://127.0.0.1:<port>` → `target` (host:port).
pub struct FaultProxy {
    /// Its port on 127.0.0.1.
    pub port: u16,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

impl FaultProxy {
    /// Proxies a free loopback port to `target` (`127.0.0.1:PORT`).
    pub fn start(target: &str) -> Result<FaultProxy, String> {
        Self::start_split(target, None)
    }

    /// One GCS host made of two servers, as `storage.googleapis.com` serves both APIs:
    /// requests of GCS's JSON API (paths under `/storage/v1/` and `/upload/storage/v1/`) go
    /// to `json_target` (gcsemulator), every other one (the XML API) to `xml_target` (moto).
    /// The two keep separate objects.
    pub fn start_gcs(xml_target: &str, json_target: &str) -> Result<FaultProxy, String> {
        Self::start_split(xml_target, Some(json_target.to_string()))
    }

    fn start_split(target: &str, json_target: Option<String>) -> Result<FaultProxy, String> {
        let listener =
            TcpListener::bind("127.0.0.1:0").map_err(|e| format!("fault proxy bind: {e}"))?;
        let port = listener
            .local_addr()
            .map_err(|e| format!("fault proxy address: {e}"))?
            .port();
        let shared = Arc::new(Shared {
            target: target.to_string(),
            json_target,
            rules: Mutex::new(Vec::new()),
            seen: Mutex::new(Vec::new()),
            arrived: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            body_rate: AtomicU64::new(0),
            brake: Mutex::new(Brake {
                listener: listener.try_clone().ok(),
                on: false,
            }),
            late_ms: AtomicU64::new(0),
        });
        let s = shared.clone();
        let acceptor = thread::spawn(move || {
            for conn in listener.incoming() {
                if s.stop.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let s = s.clone();
                thread::spawn(move || serve(conn, &s));
            }
        });
        Ok(FaultProxy {
            port,
            shared,
            acceptor: Some(acceptor),
        })
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Adds a rule (the first matching rule applies).
    pub fn add(&self, rule: Rule) {
        lock(&self.shared.rules).push(rule);
        brake(&self.shared);
    }

    /// Reads the body of every request arriving from now on at `bytes_per_second`, through a
    /// small receive buffer (`None`: as fast as it comes): a slow uplink that keeps moving.
    /// A request already arrived goes on at the rate it came with; one whose connection was
    /// made before the call, and arrives after, is read at the new rate, with the buffer its
    /// connection had (see [`Brake`]).
    pub fn slow_body_reads(&self, bytes_per_second: Option<u64>) {
        self.shared
            .body_rate
            .store(bytes_per_second.unwrap_or(0), Ordering::SeqCst);
        brake(&self.shared);
    }

    /// Removes every rule.
    pub fn clear(&self) {
        lock(&self.shared.rules).clear();
        brake(&self.shared);
    }

    /// The requests seen so far.
    pub fn seen(&self) -> Vec<SeenRequest> {
        lock(&self.shared.seen).clone()
    }

    /// The requests that have arrived so far (method, target), answered or not, each from
    /// the moment its head was read: a request held by [`Fault::Hold`] or [`Fault::Delay`],
    /// or whose body is still being read, is here before it is in [`Self::seen`].
    pub fn arrived(&self) -> Vec<(String, String)> {
        lock(&self.shared.arrived).clone()
    }

    /// Forgets the requests seen so far.
    pub fn forget(&self) {
        lock(&self.shared.seen).clear();
        lock(&self.shared.arrived).clear();
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // The acceptor's socket is the last one open: the port refuses once it ends.
        lock(&self.shared.brake).listener = None;
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn serve(mut client: TcpStream, s: &Shared) {
    let late = s.late_ms.load(Ordering::SeqCst);
    if late > 0 {
        thread::sleep(Duration::from_millis(late));
    }
    let _ = client.set_read_timeout(Some(IO_TIMEOUT));
    let _ = client.set_write_timeout(Some(IO_TIMEOUT));
    let rate = s.body_rate.load(Ordering::SeqCst);
    let Some((head, rest)) = read_head(&mut client, &s.arrived) else {
        return;
    };
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or_default().to_string();
    let mut parts = request_line.split(' ');
    let method = parts.next().unwrap_or_default().to_string();
    let target = parts.next().unwrap_or_default().to_string();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let mut seen = SeenRequest {
        method,
        target,
        headers,
        status: 0,
        faulted: false,
    };
    let fault = {
        let mut rules = lock(&s.rules);
        rules.iter_mut().find(|r| r.matches(&seen)).map(|r| {
            if let Some(n) = &mut r.times {
                *n -= 1;
            }
            r.fault.clone()
        })
    };
    brake(s);
    match &fault {
        Some(Fault::Early(status, code, early_rate)) => {
            let _ = client.write_all(error_answer(*status, code, false).as_bytes());
            seen.status = *status;
            seen.faulted = true;
            lock(&s.seen).push(seen);
            let _ = read_body(&mut client, &head, rest, *early_rate);
            let _ = client.shutdown(Shutdown::Both);
            return;
        }
        Some(Fault::EarlyStall(status, code, d)) => {
            let _ = client.write_all(error_answer(*status, code, false).as_bytes());
            seen.status = *status;
            seen.faulted = true;
            lock(&s.seen).push(seen);
            hold(s, *d);
            let _ = client.shutdown(Shutdown::Both);
            return;
        }
        Some(Fault::Stall(d)) => {
            seen.faulted = true;
            lock(&s.seen).push(seen);
            hold(s, *d);
            let _ = client.shutdown(Shutdown::Both);
            return;
        }
        _ => {}
    }
    let Some(body) = read_body(&mut client, &head, rest, rate) else {
        return;
    };
    let mut strip = None;
    let mut forwarded = None;
    let fault = match fault {
        Some(Fault::StripRequestHeader(name)) => {
            let mut without = seen.clone();
            without
                .headers
                .retain(|(k, _)| !k.eq_ignore_ascii_case(&name));
            forwarded = Some(without);
            None
        }
        Some(Fault::Early(..) | Fault::EarlyStall(..) | Fault::Stall(..)) => None,
        Some(Fault::StripAnswerHeader(name)) => {
            strip = Some(name);
            None
        }
        Some(Fault::EmulateCopyIfMatch) => {
            copy_if_match_fails(s, &seen).then(|| (412, "PreconditionFailed".to_string()))
        }
        Some(Fault::ErrorIn200(code)) => Some((200, code)),
        Some(Fault::Status(status, code)) => Some((status, code)),
        Some(Fault::PassThenStatus(status, code)) => {
            let _ = pass_on(s, &seen, &body);
            Some((status, code))
        }
        Some(Fault::Drop) => {
            seen.faulted = true;
            None
        }
        Some(Fault::Hold(d)) => {
            // Recorded now: the test sees that it came, not only when it is let go.
            let mut held = seen.clone();
            held.faulted = true;
            lock(&s.seen).push(held);
            hold(s, d);
            let _ = client.shutdown(Shutdown::Both);
            return;
        }
        Some(Fault::Delay(d)) => {
            thread::sleep(d);
            None
        }
        Some(Fault::HoldAnswer(d)) => {
            let mut landed = seen.clone();
            landed.status = pass_on(s, &seen, &body).map_or(0, |a| answer_status(&a));
            landed.faulted = true;
            // Recorded once the store has it: the test sees that it landed.
            lock(&s.seen).push(landed);
            hold(s, d);
            let _ = client.shutdown(Shutdown::Both);
            return;
        }
        Some(Fault::CutBody(n, d)) => {
            let mut cut = seen.clone();
            cut.faulted = true;
            if let Some(answer) = pass_on(s, &seen, &body) {
                cut.status = answer_status(&answer);
                let head_end = answer
                    .windows(4)
                    .position(|w| w == b"\r\n\r\n")
                    .map_or(answer.len(), |i| i + 4);
                let _ = client.write_all(&answer[..(head_end + n).min(answer.len())]);
                let _ = client.flush();
            }
            lock(&s.seen).push(cut);
            hold(s, d);
            let _ = client.shutdown(Shutdown::Both);
            return;
        }
        Some(Fault::DelayThenStatus(d, status, code)) => {
            hold(s, d);
            Some((status, code))
        }
        Some(Fault::Rewrite(f)) => {
            seen.faulted = true;
            if let Some(answer) = pass_on(s, &seen, &body) {
                let answer = f(&answer);
                seen.status = answer_status(&answer);
                let _ = client.write_all(&answer);
            }
            None
        }
        None => None,
    };
    match fault {
        _ if seen.faulted => {}
        Some((status, code)) => {
            let _ = client.write_all(error_answer(status, &code, true).as_bytes());
            seen.status = status;
            seen.faulted = true;
        }
        None => {
            let req = forwarded.as_ref().unwrap_or(&seen);
            seen.status = forward(&mut client, s, req, &body, strip.as_deref());
        }
    }
    let _ = client.shutdown(Shutdown::Both);
    lock(&s.seen).push(seen);
}

/// A rule answering before it reads the body is pending: its connection reads the body
/// slowly, through the small buffer.
fn early_pending(s: &Shared) -> bool {
    lock(&s.rules).iter().any(|r| {
        matches!(r.fault, Fault::Early(..) | Fault::EarlyStall(..)) && r.times.is_none_or(|n| n > 0)
    })
}

/// Sets the listening socket's receive buffer for the connections to come (see [`Brake`]).
fn brake(s: &Shared) {
    let want = s.body_rate.load(Ordering::SeqCst) > 0 || early_pending(s);
    let mut b = lock(&s.brake);
    if b.on == want {
        return;
    }
    if let Some(l) = &b.listener {
        let size = if want {
            SLOW_RECEIVE_BUFFER
        } else {
            default_receive_buffer()
        };
        set_receive_buffer(l, size);
    }
    b.on = want;
}

/// The kernel's initial receive buffer of a TCP connection (`tcp_rmem`'s second field),
/// halved as `SO_RCVBUF` doubles what it is given.
fn default_receive_buffer() -> libc::c_int {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_rmem")
        .ok()
        .and_then(|t| t.split_whitespace().nth(1)?.parse::<libc::c_int>().ok())
        .map_or(64 << 10, |n| n / 2)
}

/// Sets a socket's receive buffer to `size` (best effort: a kernel that refuses leaves the
/// read rate as the only brake).
fn set_receive_buffer(c: &TcpListener, size: libc::c_int) {
    // SAFETY: a valid socket descriptor, and a pointer to an int of the size given.
    unsafe {
        libc::setsockopt(
            c.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&size as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

/// An answer of `status` with an S3 error document of `code`; `close`: it says
/// `Connection: close`.
fn error_answer(status: u16, code: &str, close: bool) -> String {
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{code}</Code>\
         <Message>injected by the test's fault proxy</Message></Error>"
    );
    format!(
        "HTTP/1.1 {status} Injected\r\nContent-Type: application/xml\r\n\
         Content-Length: {}\r\n{}\r\n{body}",
        body.len(),
        if close { "Connection: close\r\n" } else { "" }
    )
}

/// Waits `d` (at most [`MAX_HOLD`]) in steps, so a dropped proxy does not wait it all.
fn hold(s: &Shared, d: Duration) {
    let until = Instant::now() + d.min(MAX_HOLD);
    while Instant::now() < until && !s.stop.load(Ordering::SeqCst) {
        thread::sleep(Duration::from_millis(50));
    }
}

/// Reads a request head; the request is in `arrived` (method, target) once it is read.
/// The head, and the bytes of the body read with it.
fn read_head(
    c: &mut TcpStream,
    arrived: &Mutex<Vec<(String, String)>>,
) -> Option<(String, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 << 10];
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        if buf.len() > MAX_HEAD {
            return None;
        }
        let n = c.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let mut line = head.split("\r\n").next().unwrap_or_default().split(' ');
    let (method, target) = (
        line.next().unwrap_or_default(),
        line.next().unwrap_or_default(),
    );
    lock(arrived).push((method.to_string(), target.to_string()));
    Some((head, buf[end + 4..].to_vec()))
}

/// Reads the rest of the `Content-Length` body of the request of `head` (`body`: what was
/// read with the head), at `rate` bytes per second when it is not 0.
fn read_body(c: &mut TcpStream, head: &str, mut body: Vec<u8>, rate: u64) -> Option<Vec<u8>> {
    let mut chunk = [0u8; 16 << 10];
    let len = head
        .split("\r\n")
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    if len > MAX_BODY {
        return None;
    }
    let started = Instant::now();
    while body.len() < len {
        let want = if rate > 0 {
            // Read only once the bytes so far are paid for at `rate`.
            let due = Duration::from_secs_f64(body.len() as f64 / rate as f64);
            if let Some(wait) = due.checked_sub(started.elapsed()) {
                thread::sleep(wait);
            }
            SLOW_READ.min(len - body.len())
        } else {
            chunk.len()
        };
        let n = c.read(&mut chunk[..want]).ok()?;
        if n == 0 {
            return None;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    body.truncate(len);
    Some(body)
}

/// Sends the request to the target and its answer back (without the header `strip`); the
/// answer's status (0: none).
fn forward(
    client: &mut TcpStream,
    s: &Shared,
    req: &SeenRequest,
    body: &[u8],
    strip: Option<&str>,
) -> u16 {
    let Some(mut answer) = pass_on(s, req, body) else {
        return 0;
    };
    if let Some(name) = strip {
        answer = without_header(&answer, name);
    }
    let status = answer_status(&answer);
    let _ = client.write_all(&answer);
    status
}

/// The HTTP answer `answer` without its header lines named `name` (any case).
fn without_header(answer: &[u8], name: &str) -> Vec<u8> {
    let Some(end) = answer.windows(4).position(|w| w == b"\r\n\r\n") else {
        return answer.to_vec();
    };
    let head = String::from_utf8_lossy(&answer[..end]);
    let kept: Vec<&str> = head
        .split("\r\n")
        .filter(|l| {
            l.split_once(':')
                .is_none_or(|(k, _)| !k.trim().eq_ignore_ascii_case(name))
        })
        .collect();
    let mut out = kept.join("\r\n").into_bytes();
    out.extend_from_slice(&answer[end..]);
    out
}

/// [`Fault::EmulateCopyIfMatch`]: whether the copy `req` names in `x-amz-copy-source-if-match`
/// another ETag than its source has now (asked of the target with a HEAD carrying the copy's
/// `Host` and `Authorization`, which moto does not verify). A source the
/// HEAD does not find, or a copy without the header, is the target's to answer.
fn copy_if_match_fails(s: &Shared, req: &SeenRequest) -> bool {
    let (Some(want), Some(source)) = (
        req.header("x-amz-copy-source-if-match"),
        req.header("x-amz-copy-source"),
    ) else {
        return false;
    };
    let head = SeenRequest {
        method: "HEAD".into(),
        target: format!("/{}", source.trim_start_matches('/')),
        headers: req
            .headers
            .iter()
            // moto takes the account from the (unverified) Authorization.
            .filter(|(k, _)| k == "host" || k == "authorization")
            .cloned()
            .collect(),
        status: 0,
        faulted: false,
    };
    let Some(answer) = pass_on(s, &head, b"") else {
        return false;
    };
    if answer_status(&answer) != 200 {
        return false;
    }
    let end = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or(answer.len());
    let found = String::from_utf8_lossy(&answer[..end])
        .split("\r\n")
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("etag"))
        .map(|(_, v)| v.trim().trim_matches('"').to_ascii_lowercase());
    let want = want.trim().trim_matches('"').to_ascii_lowercase();
    found.is_some_and(|f| f != want)
}

/// The status of an HTTP answer's first line (0 when it has none).
fn answer_status(answer: &[u8]) -> u16 {
    String::from_utf8_lossy(&answer[..answer.len().min(64)])
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// Sends the request to the target and reads its whole answer; `None` when it could not be
/// sent.
fn pass_on(s: &Shared, req: &SeenRequest, body: &[u8]) -> Option<Vec<u8>> {
    let to = match &s.json_target {
        Some(json)
            if req.target.starts_with("/storage/v1/")
                || req.target.starts_with("/upload/storage/v1/") =>
        {
            json
        }
        _ => &s.target,
    };
    let Ok(mut up) = TcpStream::connect(to) else {
        return None;
    };
    let _ = up.set_read_timeout(Some(IO_TIMEOUT));
    let _ = up.set_write_timeout(Some(IO_TIMEOUT));
    let mut head = format!("{} {} HTTP/1.1\r\n", req.method, req.target);
    for (k, v) in &req.headers {
        if k != "connection" && k != "keep-alive" {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
    }
    head.push_str("connection: close\r\n\r\n");
    if up.write_all(head.as_bytes()).is_err() || up.write_all(body).is_err() {
        return None;
    }
    let mut answer = Vec::new();
    let _ = up.read_to_end(&mut answer);
    Some(answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Review f55s: a body read slowly is read at its rate from its first byte. The small
    /// receive buffer was set on the connection once accepted, after the client had sent
    /// into the window offered at the handshake: the kernel pruned and dropped, and the body
    /// came on the client's zero-window probes, at about 160 kB/s (6 s here, not 1 s), when
    /// the connection's thread ran after the client's first bytes came.
    #[test]
    fn a_slow_body_is_read_at_its_rate_from_its_first_byte() {
        // Nothing is passed on: the rule answers once the body is read.
        let proxy = FaultProxy::start("127.0.0.1:9").unwrap();
        // The connection's thread starts after the client sent into the window offered at
        // the handshake, as it often did on a loaded machine.
        proxy.shared.late_ms.store(50, Ordering::SeqCst);
        proxy.add(Rule::new(Fault::Status(500, "SlowlyRead".into())).method("PUT"));
        proxy.slow_body_reads(Some(1_000_000));
        let body = vec![b'x'; 1_000_000];
        let started = Instant::now();
        let mut c = TcpStream::connect(("127.0.0.1", proxy.port)).unwrap();
        let head = format!(
            "PUT /bucket/key HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        let mut request = head.into_bytes();
        request.extend_from_slice(&body);
        c.write_all(&request).unwrap();
        let mut answer = Vec::new();
        c.read_to_end(&mut answer).unwrap();
        let took = started.elapsed();
        assert!(
            answer.starts_with(b"HTTP/1.1 500"),
            "{}",
            String::from_utf8_lossy(&answer)
        );
        assert!(
            took >= Duration::from_millis(900) && took < Duration::from_secs(3),
            "1 MB at 1 MB/s read in {took:?}"
        );
    }
}
