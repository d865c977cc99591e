//! Answers a client does not read: the socket wrapper that tells a connection's place when
//! an answer cannot be written out and when everything is out again ([`Watched`]), the
//! watch that cuts a leaving connection whose answer is stuck ([`stuck_answer`]), and the
//! wait that keeps a pipelined request from being answered before the client has read the
//! answers before it ([`earlier_answers_read`]). So a client that never reads holds one
//! answer, and ranks first to give way once it has waited [`UNREAD_AFTER`].

use std::io;
use std::os::fd::RawFd;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

use super::slot::{Slot, UNREAD_AFTER};

/// How often a connection that is leaving looks whether its answer is stuck.
const LEAVING_CHECK: Duration = Duration::from_millis(100);
/// How often a pipelined request looks whether the client has read the answers before it
/// ([`earlier_answers_read`]): a few times within [`UNREAD_AFTER`].
const PIPELINE_CHECK: Duration = Duration::from_millis(50);

/// A connection's socket, telling its place when an answer cannot be written out (the
/// client does not read) and when everything is out again.
pub(in crate::events::http) struct Watched<T> {
    io: T,
    slot: Arc<Slot>,
}

impl<T> Watched<T> {
    pub(in crate::events::http) fn new(io: T, slot: Arc<Slot>) -> Watched<T> {
        Watched { io, slot }
    }

    fn note<R>(&self, r: &Poll<io::Result<R>>) {
        if r.is_pending() {
            self.slot.write_blocked();
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write(cx, buf);
        self.note(&r);
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.note(&r);
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    /// hyper flushes the socket only once its own buffer is written out: everything is out.
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.io).poll_flush(cx);
        if matches!(r, Poll::Ready(Ok(()))) {
            self.slot.flushed();
        }
        r
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Waits until a leaving connection's answer has waited [`UNREAD_AFTER`] for its client to
/// read it: then it is cut rather than given the rest of [`LEAVE_GRACE`](super::LEAVE_GRACE).
pub(in crate::events::http) async fn stuck_answer(slot: &Slot) {
    loop {
        tokio::time::sleep(LEAVING_CHECK).await;
        if slot.not_reading(Instant::now()) {
            return;
        }
    }
}

/// Waits, before a request is answered, until its client has read every answer sent before
/// it on the connection (none of their bytes is left in the socket's send queue).
///
/// Ray's agent, kubelet and Prometheus send a request only once they have read the answer
/// to the one before (the acknowledgement of its bytes travels ahead of the next request),
/// so for them this never waits. A client that pipelines requests and never reads would
/// otherwise be answered until the kernel's and hyper's buffers are full (a dozen renders
/// of `/metrics` for each connection), which a stream of such connections turns into all
/// the CPU a small or debug build has, Ray's batches then waiting for their turn past Ray's
/// 3 s. Here each such connection gets one answer: the wait counts as an answer waiting to
/// be read (so the connection ranks [`Eviction::NotReading`](super::Eviction::NotReading) at the cap), and after
/// [`UNREAD_AFTER`] the connection is cut ([`Slot::cut`]).
pub(in crate::events::http) async fn earlier_answers_read(fd: RawFd, slot: &Slot) {
    let started = Instant::now();
    loop {
        match unsent_bytes(fd) {
            Ok(0) | Err(_) => {
                // Nothing written so far waits in the socket: every answer is out.
                slot.flushed();
                return;
            }
            Ok(_) => {}
        }
        slot.write_blocked();
        if started.elapsed() >= UNREAD_AFTER {
            slot.cut.notify_one();
            return std::future::pending().await;
        }
        tokio::time::sleep(PIPELINE_CHECK).await;
    }
}

/// Bytes written to the socket that its peer has not yet acknowledged (`SIOCOUTQ`).
#[cfg(target_os = "linux")]
fn unsent_bytes(fd: RawFd) -> io::Result<usize> {
    let mut n: libc::c_int = 0;
    // SAFETY: ioctl(TIOCOUTQ, int *) on a socket the caller's connection owns and keeps open
    // while its requests are served.
    let r = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut n as *mut libc::c_int) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(usize::try_from(n).unwrap_or(0))
}

/// Elsewhere the send queue is not looked at: pipelined requests are answered as they come.
#[cfg(not(target_os = "linux"))]
fn unsent_bytes(_fd: RawFd) -> io::Result<usize> {
    Ok(0)
}
