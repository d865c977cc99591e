//! What a connection may hold, and for how long, when its client does not read its answers.
//!
//! A client that sends requests and never reads the answers (pipelined `GET`s behind a small
//! receive window, or one big answer left unread) is neither idle nor finished: hyper waits to
//! write, the header timeout does not apply, and the connection's place and its unsent answer
//! are held for as long as the client keeps the socket (review r36e: 512 such clients held
//! every place for good; 200 held 1.3 GiB of `/api/v0/tasks` answers). So:
//!
//! - **Write progress.** [`Watched`] wraps each socket: an answer whose writes make no progress
//!   (the kernel's buffers full, nothing taken) for [`WRITE_STALL_TIMEOUT`] fails the
//!   connection, which closes it, drops its answer and frees its place. A slow reader that
//!   takes some bytes now and then is not cut: only a stall counts.
//! - **Giving way at the cap.** When all [`MAX_CONNECTIONS`](super::MAX_CONNECTIONS) places are
//!   taken, a new connection takes the place of the one whose writes have been stalled the
//!   longest, if for at least [`GIVE_WAY_AFTER`] ([`Places::give_way`]): a client on loopback
//!   or the pod network reads a probe's answer within milliseconds, so a new client (the
//!   readiness probe) is not locked out by clients that do not read.
//!
//! The bytes of answers themselves are bounded by [`super::inflight`].

use std::future::Future as _;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;

/// How long an answer may make no write progress before its connection is closed. Ten
/// seconds, as the header timeout: a client that reads, however slowly, takes bytes far
/// more often; one that has stopped reading for this long has gone (or never read).
pub const WRITE_STALL_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a connection's writes must have been stalled before it gives its place to a new
/// connection at the cap.
pub const GIVE_WAY_AFTER: Duration = Duration::from_secs(1);

/// What the accept loop knows about one open connection.
#[derive(Debug, Default)]
pub(super) struct Tracked {
    /// Milliseconds since [`Places::epoch`] at which its writes stalled (plus one); 0: not
    /// stalled.
    stalled_since: AtomicU64,
    /// Chosen to give way: it must close.
    cut: AtomicBool,
    cut_now: Notify,
}

impl Tracked {
    /// Resolves once the connection has been chosen to give way.
    pub(super) async fn cut(&self) {
        loop {
            let notified = self.cut_now.notified();
            if self.cut.load(Ordering::Acquire) {
                return;
            }
            notified.await;
        }
    }
}

/// The open connections, to choose one that gives way.
#[derive(Debug)]
pub(super) struct Places {
    epoch: Instant,
    open: Mutex<Vec<std::sync::Weak<Tracked>>>,
}

impl Places {
    pub(super) fn new() -> Self {
        Places {
            epoch: Instant::now(),
            open: Mutex::new(Vec::new()),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// A new connection's record, watched by [`Places::give_way`] until it is dropped.
    pub(super) fn track(&self) -> Arc<Tracked> {
        let t = Arc::new(Tracked::default());
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.retain(|w| w.strong_count() > 0);
        open.push(Arc::downgrade(&t));
        t
    }

    /// Chooses the connection whose writes have been stalled longest, for at least
    /// [`GIVE_WAY_AFTER`], and tells it to close. `false`: none may give way.
    pub(super) fn give_way(&self) -> bool {
        let now = self.now_ms();
        let limit = u64::try_from(GIVE_WAY_AFTER.as_millis()).unwrap_or(u64::MAX);
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let victim = open
            .iter()
            .filter_map(std::sync::Weak::upgrade)
            .filter(|t| !t.cut.load(Ordering::Acquire))
            .filter_map(|t| {
                let since = t.stalled_since.load(Ordering::Acquire);
                (since != 0 && now.saturating_sub(since - 1) >= limit).then_some((since, t))
            })
            .min_by_key(|(since, _)| *since);
        drop(open);
        match victim {
            Some((_, t)) => {
                t.cut.store(true, Ordering::Release);
                t.cut_now.notify_waiters();
                true
            }
            None => false,
        }
    }
}

/// A socket whose writes must make progress: see the module doc.
pub(super) struct Watched<S> {
    inner: S,
    places: Arc<Places>,
    tracked: Arc<Tracked>,
    /// Armed while a write is stalled: when it fires, the write fails.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Armed while a pipelined request waits for the answers before it.
    recheck: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> Watched<S> {
    pub(super) fn new(inner: S, places: Arc<Places>, tracked: Arc<Tracked>) -> Self {
        Watched {
            inner,
            places,
            tracked,
            deadline: None,
            recheck: None,
        }
    }

    /// A write returned `poll`: bytes taken (`progress`) clear the stall, `Pending` starts it
    /// (once) and fails the write once it has lasted [`WRITE_STALL_TIMEOUT`].
    fn account<T>(
        &mut self,
        cx: &mut Context<'_>,
        poll: Poll<io::Result<T>>,
        progress: impl FnOnce(&T) -> bool,
    ) -> Poll<io::Result<T>> {
        match poll {
            Poll::Pending => {
                let deadline = self.deadline.get_or_insert_with(|| {
                    let since = self.places.now_ms().saturating_add(1);
                    self.tracked.stalled_since.store(since, Ordering::Release);
                    Box::pin(tokio::time::sleep(WRITE_STALL_TIMEOUT))
                });
                match deadline.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "the client read nothing of its answer for {WRITE_STALL_TIMEOUT:?}"
                        ),
                    ))),
                    Poll::Pending => Poll::Pending,
                }
            }
            Poll::Ready(Ok(v)) => {
                if progress(&v) && self.deadline.take().is_some() {
                    self.tracked.stalled_since.store(0, Ordering::Release);
                }
                Poll::Ready(Ok(v))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
        }
    }
}

/// A socket the watch can look into.
pub(super) trait Socket: AsyncRead + AsyncWrite + Unpin {
    /// Bytes written that the peer has not acknowledged yet.
    fn unsent(&self) -> usize;
    /// Ready once there is something to read (without reading it).
    fn poll_readable(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;
}

impl Socket for tokio::net::TcpStream {
    fn unsent(&self) -> usize {
        unsent_bytes(self)
    }

    fn poll_readable(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_read_ready(cx)
    }
}

/// Bytes written to the socket that its peer has not yet acknowledged (`TIOCOUTQ`).
#[cfg(target_os = "linux")]
fn unsent_bytes(s: &tokio::net::TcpStream) -> usize {
    use std::os::fd::AsRawFd as _;
    let mut n: libc::c_int = 0;
    // SAFETY: ioctl(TIOCOUTQ, int *) on the socket `s` borrows, open for the call's length.
    let r = unsafe { libc::ioctl(s.as_raw_fd(), libc::TIOCOUTQ, &mut n as *mut libc::c_int) };
    if r < 0 {
        return 0;
    }
    usize::try_from(n).unwrap_or(0)
}

/// Elsewhere the send queue is not looked at: pipelined requests are read as they come.
#[cfg(not(target_os = "linux"))]
fn unsent_bytes(_s: &tokio::net::TcpStream) -> usize {
    0
}

/// How often a pipelined request looks whether the answers before it have been taken.
const PIPELINE_CHECK: Duration = Duration::from_millis(20);

impl<S: Socket> AsyncRead for Watched<S> {
    /// A request is read once the answers before it are out of the kernel: a client that
    /// pipelines requests and does not read the answers is stalled at its second request
    /// (its wait counts as a write stall), not answered for as long as it sends. A client that
    /// reads its answer before its next request acknowledges it with that request, so it does
    /// not wait.
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            match self.inner.poll_readable(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => {}
            }
            if self.inner.unsent() == 0 {
                if self.deadline.take().is_some() {
                    self.tracked.stalled_since.store(0, Ordering::Release);
                }
                self.recheck = None;
                return Pin::new(&mut self.inner).poll_read(cx, buf);
            }
            if let Poll::Ready(Err(e)) =
                self.account(cx, Poll::<io::Result<()>>::Pending, |_| false)
            {
                return Poll::Ready(Err(e));
            }
            let recheck = self
                .recheck
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(PIPELINE_CHECK)));
            match recheck.as_mut().poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(()) => {
                    recheck.as_mut().reset(Instant::now() + PIPELINE_CHECK);
                }
            }
        }
    }
}

impl<S: Socket> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.account(cx, poll, |n| *n > 0)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.account(cx, poll, |n| *n > 0)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.inner).poll_flush(cx);
        self.account(cx, poll, |_| false)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.account(cx, poll, |_| false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt as _;

    impl Socket for tokio::io::DuplexStream {
        fn unsent(&self) -> usize {
            0
        }
        fn poll_readable(&self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// A writer that never takes a byte stalls for the timeout, then fails; giving way picks
    /// it once it has stalled for [`GIVE_WAY_AFTER`], not before.
    #[tokio::test(start_paused = true)]
    async fn a_stalled_write_fails_after_the_timeout_and_gives_way() {
        let (a, _b) = tokio::io::duplex(16);
        let places = Arc::new(Places::new());
        let tracked = places.track();
        let mut w = Watched::new(a, places.clone(), tracked.clone());
        let started = Instant::now();
        let writing = tokio::spawn(async move { w.write_all(&[0u8; 64]).await });
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!places.give_way(), "stalled for less than GIVE_WAY_AFTER");
        tokio::time::sleep(GIVE_WAY_AFTER).await;
        assert!(places.give_way());
        tokio::time::timeout(Duration::from_millis(10), tracked.cut())
            .await
            .unwrap();
        let err = writing.await.unwrap().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        let took = started.elapsed();
        assert!(
            took >= WRITE_STALL_TIMEOUT && took < WRITE_STALL_TIMEOUT + Duration::from_secs(1),
            "{took:?}"
        );
    }

    /// A reader that takes a few bytes every few seconds keeps the connection: only a
    /// stall counts, not a slow answer.
    #[tokio::test(start_paused = true)]
    async fn a_slow_reader_is_not_cut() {
        use tokio::io::AsyncReadExt as _;
        let (a, mut b) = tokio::io::duplex(16);
        let places = Arc::new(Places::new());
        let mut w = Watched::new(a, places.clone(), places.track());
        let writing = tokio::spawn(async move { w.write_all(&[7u8; 160]).await });
        let mut got = 0;
        let mut buf = [0u8; 16];
        while got < 160 {
            tokio::time::sleep(WRITE_STALL_TIMEOUT / 2).await;
            got += b.read(&mut buf).await.unwrap();
        }
        writing.await.unwrap().unwrap();
    }
}
