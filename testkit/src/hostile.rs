//! Hostile HTTP clients for the tests of what the collector's HTTP side may be made to
//! hold: bodies that stop arriving, clients that never read their answers, heads that never
//! end, connections that send nothing; and [`tries`], which counts how often Ray and the probe still get through (each try
//! on a fresh connection, within Ray's 3 s, as Ray's dashboard agent and kubelet do).
//!
//! Every client here talks to 127.0.0.1 only and stops (its threads joined, its sockets
//! closed) when its handle is dropped.

use std::io::{self, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::FromRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::http::{try_http_request_within, HttpResponse};

/// Ray's dashboard agent gives up on a request after this long (and resends it).
pub const RAY_TIMEOUT: Duration = Duration::from_secs(3);

/// A TCP connection to `addr` whose receive window stays tiny: `SO_RCVBUF` 1024 and
/// `TCP_MAXSEG` 536, set before connecting (as a client that wants the server's writes to
/// block at once would do).
pub fn tiny_window(addr: SocketAddr) -> io::Result<TcpStream> {
    let SocketAddr::V4(v4) = addr else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "only IPv4 loopback",
        ));
    };
    // SAFETY: a plain socket(2); the descriptor is owned by the TcpStream made below, or
    // closed here on error.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a socket we own; from here on the TcpStream closes it.
    let stream = unsafe { TcpStream::from_raw_fd(fd) };
    let set = |level: libc::c_int, name: libc::c_int, value: libc::c_int| {
        // SAFETY: setsockopt with a pointer to an int of the size given.
        let r = unsafe {
            libc::setsockopt(
                fd,
                level,
                name,
                &value as *const libc::c_int as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    };
    set(libc::SOL_SOCKET, libc::SO_RCVBUF, 1024)?;
    set(libc::IPPROTO_TCP, libc::TCP_MAXSEG, 536)?;
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: v4.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*v4.ip()).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: connect(2) with a sockaddr_in of the size given.
    let r = unsafe {
        libc::connect(
            fd,
            &sin as *const libc::sockaddr_in as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(stream)
}

/// Clients that open connections at a steady rate, each with a tiny receive window
/// ([`tiny_window`]), pipeline the same request on it a number of times and never read a
/// byte: the server cannot write its answers out. The newest `keep_open` connections are
/// kept open; older ones are closed by the client.
pub struct NeverReading {
    stop: Arc<AtomicBool>,
    opened: Arc<AtomicUsize>,
    thread: Option<JoinHandle<()>>,
}

impl NeverReading {
    /// Starts opening `per_second` connections a second to `addr`, each sending `request`
    /// `pipelined` times.
    pub fn start(
        addr: SocketAddr,
        per_second: u32,
        request: &[u8],
        pipelined: usize,
        keep_open: usize,
    ) -> NeverReading {
        let stop = Arc::new(AtomicBool::new(false));
        let opened = Arc::new(AtomicUsize::new(0));
        let burst = request.repeat(pipelined);
        let thread = {
            let (stop, opened) = (stop.clone(), opened.clone());
            std::thread::spawn(move || {
                let every = Duration::from_secs(1) / per_second.max(1);
                let mut open: std::collections::VecDeque<TcpStream> = Default::default();
                let mut next = Instant::now();
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(mut s) = tiny_window(addr) {
                        // A write that cannot finish (the server closed, or its window is
                        // full) is left as it is: this client never reads.
                        let _ = s.set_nonblocking(true);
                        let _ = s.write(&burst);
                        opened.fetch_add(1, Ordering::Relaxed);
                        open.push_back(s);
                        if open.len() > keep_open {
                            open.pop_front();
                        }
                    }
                    next += every;
                    let now = Instant::now();
                    if next > now {
                        std::thread::sleep(next - now);
                    } else {
                        next = now;
                    }
                }
            })
        };
        NeverReading {
            stop,
            opened,
            thread: Some(thread),
        }
    }

    /// Connections opened so far.
    pub fn opened(&self) -> usize {
        self.opened.load(Ordering::Relaxed)
    }
}

impl Drop for NeverReading {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Clients that open connections at a steady rate and send nothing on them, as a client
/// that only connects would; the newest `keep_open` are kept open, older ones closed by the
/// client.
pub struct Silent {
    stop: Arc<AtomicBool>,
    opened: Arc<AtomicUsize>,
    thread: Option<JoinHandle<()>>,
}

impl Silent {
    /// Starts opening `per_second` connections a second to `addr`.
    pub fn start(addr: SocketAddr, per_second: u32, keep_open: usize) -> Silent {
        Silent::sending(addr, per_second, keep_open, 0, Vec::new())
    }

    /// Like [`Silent::start`], but each connection sends `request` (within 200 ms) and
    /// never reads its answer; the first `burst` connections are opened at once.
    pub fn sending(
        addr: SocketAddr,
        per_second: u32,
        keep_open: usize,
        burst: usize,
        request: Vec<u8>,
    ) -> Silent {
        let stop = Arc::new(AtomicBool::new(false));
        let opened = Arc::new(AtomicUsize::new(0));
        let thread = {
            let (stop, opened) = (stop.clone(), opened.clone());
            std::thread::spawn(move || {
                let every = Duration::from_secs(1) / per_second.max(1);
                let mut open: std::collections::VecDeque<TcpStream> = Default::default();
                let mut next = Instant::now();
                let mut n = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(200))
                    {
                        if !request.is_empty() {
                            let _ = s.set_write_timeout(Some(Duration::from_millis(200)));
                            let _ = s.write_all(&request);
                        }
                        opened.fetch_add(1, Ordering::Relaxed);
                        open.push_back(s);
                        if open.len() > keep_open {
                            open.pop_front();
                        }
                    }
                    n += 1;
                    if n < burst {
                        next = Instant::now();
                        continue;
                    }
                    next += every;
                    let now = Instant::now();
                    if next > now {
                        std::thread::sleep(next - now);
                    } else {
                        next = now;
                    }
                }
            })
        };
        Silent {
            stop,
            opened,
            thread: Some(thread),
        }
    }

    /// Connections opened so far.
    pub fn opened(&self) -> usize {
        self.opened.load(Ordering::Relaxed)
    }
}

impl Drop for Silent {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A `POST /v1/events` on a fresh connection that declares `declared` bytes of body, sends
/// `send` of them (spaces after a `[`) as fast as the server reads them, then nothing more.
/// The stream is returned open: the body stays incomplete until it is dropped. A write error
/// (the server closed the connection) ends the sending early.
pub fn stalled_body(port: u16, declared: u64, send: usize) -> io::Result<TcpStream> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    let head = format!(
        "POST /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {declared}\r\n\r\n"
    );
    s.write_all(head.as_bytes())?;
    let mut chunk = vec![b' '; 1 << 20];
    chunk[0] = b'[';
    let mut left = send;
    while left > 0 {
        let n = left.min(chunk.len());
        if s.write_all(&chunk[..n]).is_err() {
            break;
        }
        chunk[0] = b' ';
        left -= n;
    }
    Ok(s)
}

/// What [`tries`] counted.
#[derive(Debug, Default)]
pub struct Tries {
    /// Tries answered as wanted within [`RAY_TIMEOUT`].
    pub ok: usize,
    /// The others, each with what happened.
    pub failures: Vec<String>,
}

/// `n` tries of one request, `every` apart, each on a fresh connection that must get
/// `status` within [`RAY_TIMEOUT`] (connect, send and answer), as Ray's dashboard agent and
/// kubelet's probe need.
pub fn tries(
    n: usize,
    every: Duration,
    status: u16,
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Tries {
    let mut t = Tries::default();
    for i in 0..n {
        let started = Instant::now();
        let r = try_http_request_within(method, url, headers, body, RAY_TIMEOUT);
        let took = started.elapsed();
        match r {
            Ok(HttpResponse { status: s, .. }) if s == status && took <= RAY_TIMEOUT => t.ok += 1,
            Ok(r) => t.failures.push(format!(
                "try {i}: {} after {took:?}: {}",
                r.status,
                String::from_utf8_lossy(&r.body)
            )),
            Err(e) => t.failures.push(format!("try {i}: {e} after {took:?}")),
        }
        if let Some(rest) = every.checked_sub(started.elapsed()) {
            std::thread::sleep(rest);
        }
    }
    t
}

/// A connection that sends `bytes` bytes of a request head that never ends (one long header
/// line, no blank line), then nothing; returned open. Writes stop at the first error (the
/// server answered and closed) or after 2 s of a full window.
pub fn unfinished_head(port: u16, bytes: usize) -> io::Result<TcpStream> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_write_timeout(Some(Duration::from_secs(2)))?;
    let mut head = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: ".to_vec();
    head.resize(bytes.max(head.len()), b'a');
    let _ = s.write_all(&head);
    Ok(s)
}

/// Clients that POST bodies to `/v1/events` over and over, each on a fresh connection and
/// each waiting for its answer, until dropped: `threads` of them, the `n`th body of all made
/// by `body(n)`, sent with `headers` (and a `Content-Length`). The first line of each answer
/// (or the error) is counted in `answers`.
pub struct Posters {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    /// First lines of the answers, with how many times each came.
    pub answers: Arc<std::sync::Mutex<std::collections::BTreeMap<String, usize>>>,
}

impl Posters {
    pub fn start(
        port: u16,
        threads: usize,
        headers: &[(&str, &str)],
        body: Arc<dyn Fn(u64) -> Vec<u8> + Send + Sync>,
    ) -> Posters {
        let stop = Arc::new(AtomicBool::new(false));
        let answers = Arc::new(std::sync::Mutex::new(std::collections::BTreeMap::new()));
        let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let extra: String = headers
            .iter()
            .map(|(k, v)| format!("{k}: {v}\r\n"))
            .collect();
        let threads = (0..threads)
            .map(|_| {
                let (stop, answers, next, body, extra) = (
                    stop.clone(),
                    answers.clone(),
                    next.clone(),
                    body.clone(),
                    extra.clone(),
                );
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let b = body(next.fetch_add(1, Ordering::Relaxed));
                        let answer = post_once(port, &extra, &b);
                        *answers.lock().unwrap().entry(answer).or_default() += 1;
                    }
                })
            })
            .collect();
        Posters {
            stop,
            threads,
            answers,
        }
    }

    /// Stops them (each after its answer) and returns what they were answered.
    pub fn finish(mut self) -> std::collections::BTreeMap<String, usize> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        self.answers.lock().unwrap().clone()
    }
}

impl Drop for Posters {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn post_once(port: u16, extra: &str, body: &[u8]) -> String {
    use std::io::Read;
    let run = || -> io::Result<String> {
        let mut s = TcpStream::connect(("127.0.0.1", port))?;
        s.set_read_timeout(Some(Duration::from_secs(40)))?;
        s.set_write_timeout(Some(Duration::from_secs(40)))?;
        let head = format!(
            "POST /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{extra}Content-Length: {}\r\n\r\n",
            body.len()
        );
        s.write_all(head.as_bytes())?;
        s.write_all(body)?;
        let mut first = [0u8; 12];
        s.read_exact(&mut first)?;
        Ok(String::from_utf8_lossy(&first).trim().to_string())
    };
    run().unwrap_or_else(|e| format!("{:?}", e.kind()))
}
