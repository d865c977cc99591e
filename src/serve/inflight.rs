//! The bytes of answers held while they are sent, bounded whatever clients do.
//!
//! Most answers are built whole in memory (a page of tasks, a replayed snapshot) and then
//! written as fast as the client reads. A client that never reads would keep its answer in
//! memory until its connection is cut ([`super::connection`]); many would hold many (review
//! r36e: 200 unread `/api/v0/tasks?limit=10000&detail=true` answers took 1.3 GiB). So every
//! answer of a known size of at least [`COUNTED_FROM`] bytes holds its size from
//! [`MAX_ANSWER_BYTES_IN_FLIGHT`] until it has been handed to the socket in full (it is
//! handed over [`CHUNK`] bytes at a time, copied, so the whole answer is freed when its last
//! chunk is taken, not when the kernel has sent it). An answer that does not fit is dropped
//! and the request answered `503` with `Retry-After` ([`BUSY_HEADER`]). Smaller answers are
//! not counted: with [`MAX_CONNECTIONS`](super::MAX_CONNECTIONS) places they hold at most
//! 32 MiB; streamed answers (the timeline) are made as they are sent and hold a chunk or two.
//!
//! So what unread answers can make the server hold is [`MAX_ANSWER_BYTES_IN_FLIGHT`], plus what
//! hyper buffers per connection (about 400 KiB) until [`WRITE_STALL_TIMEOUT`]
//! (super::connection::WRITE_STALL_TIMEOUT) cuts it.
//!
//! An answer built once and sent to many requests ([`SharedAnswer`], the job list) is one
//! buffer: it holds its size from the budget once while any request sends it, not once per
//! request. A build that makes a large answer takes its estimated size from the same budget
//! before it starts ([`reserve`]), and is refused (`503`, [`busy`]) when that does not fit,
//! so concurrent builds cannot hold more than the budget either (review r36q D1: twelve
//! `/api/jobs/` requests each built a 70 MB list, and were refused only after, at 1 GiB).
//! An answer larger than the whole budget takes the whole budget (and is refused unless all
//! of it is free): it is built and sent alone, the only answer counted while it is, but what
//! it holds is its own size, above the budget.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse as _, Response};
use bytes::Bytes;
use http_body::Frame;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::Shared;

/// Bytes of answers held at once while they are sent: the replay's largest snapshot
/// ([`MAX_SNAPSHOT_BYTES`](super::replay::MAX_SNAPSHOT_BYTES)) four times, or about 40 of the
/// largest pages of tasks (10,000 attempts with `detail=true`, about 6.5 MB).
pub const MAX_ANSWER_BYTES_IN_FLIGHT: usize = 256 << 20;

/// Answers smaller than this are not counted (probes, `/clusters`, a page of 100 tasks).
pub const COUNTED_FROM: usize = 64 << 10;

/// How much of an answer is handed to hyper at a time.
pub const CHUNK: usize = 64 << 10;

/// Set (`true`) on the `503` of an answer that did not fit [`MAX_ANSWER_BYTES_IN_FLIGHT`].
pub const BUSY_HEADER: &str = "x-rhc-answers-in-flight-full";

/// The budget's permits count KiB, so that 256 MiB fits a semaphore's permits.
const UNIT: usize = 1024;

/// A new budget of [`MAX_ANSWER_BYTES_IN_FLIGHT`].
pub(super) fn budget() -> Arc<Semaphore> {
    Arc::new(Semaphore::new(MAX_ANSWER_BYTES_IN_FLIGHT / UNIT))
}

/// Set on an answer whose bytes are counted already ([`SharedAnswer`]): the middleware
/// passes it as it is.
#[derive(Clone, Copy)]
struct CountedAlready;

/// The budget's units for an answer of `len` bytes (the whole budget at most).
fn units(len: usize) -> u32 {
    let units = len
        .div_ceil(UNIT)
        .clamp(1, MAX_ANSWER_BYTES_IN_FLIGHT / UNIT);
    u32::try_from(units).unwrap_or(u32::MAX)
}

/// Room for `bytes` of an answer about to be built (the whole budget at most), held until
/// the permit is dropped; `None` when it does not fit now (answer [`busy`]).
pub(super) fn reserve(budget: &Arc<Semaphore>, bytes: usize) -> Option<OwnedSemaphorePermit> {
    budget.clone().try_acquire_many_owned(units(bytes)).ok()
}

/// An answer built once and sent to every request that wants it while it is kept: its
/// bytes are one buffer, held from the budget once while any request sends them.
pub(crate) struct SharedAnswer {
    body: Bytes,
    /// The place of the bytes in the budget while some request sends them.
    sending: std::sync::Mutex<std::sync::Weak<OwnedSemaphorePermit>>,
    /// Room its build took, handed to the first request that sends it ([`Self::holding`]).
    room: std::sync::Mutex<Option<Arc<OwnedSemaphorePermit>>>,
}

impl SharedAnswer {
    pub(super) fn new(body: Bytes) -> Self {
        SharedAnswer {
            body,
            sending: std::sync::Mutex::new(std::sync::Weak::new()),
            room: std::sync::Mutex::new(None),
        }
    }

    /// An answer that keeps the room its build took (`room`) until its first request sends
    /// it, so that request is not refused after the build: for an answer that is not kept
    /// (its requests come with it; it is dropped, and the room given back, when they are).
    pub(super) fn holding(body: Bytes, room: Option<OwnedSemaphorePermit>) -> Self {
        let answer = SharedAnswer::new(body);
        *answer.room.lock().unwrap_or_else(|p| p.into_inner()) = room.map(Arc::new);
        answer
    }

    /// The answer with `headers`, sent [`CHUNK`] bytes at a time: a large one takes its
    /// place in `budget` unless another request sending it holds it already, and is
    /// [`busy`] when that does not fit.
    pub(super) fn response(
        &self,
        budget: &Arc<Semaphore>,
        headers: axum::http::HeaderMap,
    ) -> Response {
        let permit = if self.body.len() < COUNTED_FROM {
            None
        } else {
            let mut sending = self.sending.lock().unwrap_or_else(|p| p.into_inner());
            let room = self.room.lock().unwrap_or_else(|p| p.into_inner()).take();
            match sending.upgrade().or(room) {
                Some(held) => {
                    *sending = Arc::downgrade(&held);
                    Some(held)
                }
                None => {
                    let Some(permit) = reserve(budget, self.body.len()) else {
                        return busy();
                    };
                    let held = Arc::new(permit);
                    *sending = Arc::downgrade(&held);
                    Some(held)
                }
            }
        };
        let mut response = (
            headers,
            Body::new(Counted {
                rest: self.body.clone(),
                permit,
            }),
        )
            .into_response();
        response.extensions_mut().insert(CountedAlready);
        response
    }
}

/// The middleware: counts a large answer of a known size, or refuses it.
pub(super) async fn bounded(State(state): State<Shared>, request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    if response.extensions().get::<CountedAlready>().is_some() {
        return response;
    }
    let Some(len) = http_body::Body::size_hint(response.body()).exact() else {
        return response;
    };
    let Ok(len) = usize::try_from(len) else {
        return response;
    };
    if len < COUNTED_FROM {
        return response;
    }
    let Some(permit) = reserve(&state.answers, len) else {
        return busy();
    };
    let (parts, body) = response.into_parts();
    // An answer of a known size is one buffer already (`Full`): this takes it, no copy.
    let Ok(data) = axum::body::to_bytes(body, usize::MAX).await else {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            "the answer could not be built",
        )
            .into_response();
    };
    Response::from_parts(
        parts,
        Body::new(Counted {
            rest: data,
            permit: Some(Arc::new(permit)),
        }),
    )
}

/// The `503` of an answer that does not fit.
pub(super) fn busy() -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [
            (axum::http::header::RETRY_AFTER, "1"),
            (axum::http::HeaderName::from_static(BUSY_HEADER), "true"),
        ],
        format!(
            "answers in flight fill their {} MiB: try again",
            MAX_ANSWER_BYTES_IN_FLIGHT >> 20
        ),
    )
        .into_response()
}

/// An answer handed over [`CHUNK`] bytes at a time, holding its permit (shared by the
/// requests that send the same [`SharedAnswer`]) until the last chunk is taken (or the
/// answer dropped).
struct Counted {
    rest: Bytes,
    permit: Option<Arc<OwnedSemaphorePermit>>,
}

impl http_body::Body for Counted {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.rest.is_empty() {
            self.permit = None;
            return Poll::Ready(None);
        }
        let n = self.rest.len().min(CHUNK);
        let chunk = Bytes::copy_from_slice(&self.rest[..n]);
        if n == self.rest.len() {
            // The last chunk: the whole answer is freed here, and its place in the budget.
            self.rest = Bytes::new();
            self.permit = None;
        } else {
            self.rest = self.rest.slice(n..);
        }
        Poll::Ready(Some(Ok(Frame::data(chunk))))
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.rest.len() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt as _;

    /// The permit is held until the last chunk is taken, and the chunks make the answer.
    #[tokio::test]
    async fn the_permit_lasts_until_the_last_chunk() {
        let budget = budget();
        let all = budget.available_permits();
        let data: Vec<u8> = (0..(CHUNK * 2 + 10)).map(|i| (i % 251) as u8).collect();
        let permit = budget.clone().try_acquire_many_owned(300).unwrap();
        let mut body = Counted {
            rest: Bytes::from(data.clone()),
            permit: Some(Arc::new(permit)),
        };
        let mut got = Vec::new();
        for _ in 0..2 {
            let f = body.frame().await.unwrap().unwrap();
            got.extend_from_slice(&f.into_data().unwrap());
            assert_eq!(budget.available_permits(), all - 300);
        }
        let f = body.frame().await.unwrap().unwrap();
        got.extend_from_slice(&f.into_data().unwrap());
        assert_eq!(budget.available_permits(), all);
        assert!(body.frame().await.is_none());
        assert_eq!(got, data);
    }

    /// Review r36q D1: requests that send the same shared answer hold its size once; it is
    /// given back when the last of them is done, and a request finds no room only when the
    /// answer is not being sent and does not fit.
    #[tokio::test]
    async fn a_shared_answer_holds_its_size_once_while_sent() {
        let budget = budget();
        let all = budget.available_permits();
        let data: Vec<u8> = (0..(CHUNK * 3)).map(|i| (i % 251) as u8).collect();
        let shared = SharedAnswer::new(Bytes::from(data.clone()));
        let units = CHUNK * 3 / UNIT;
        let a = shared.response(&budget, Default::default());
        let b = shared.response(&budget, Default::default());
        assert_eq!(budget.available_permits(), all - units, "held once");
        assert!(a.extensions().get::<CountedAlready>().is_some());
        let got = axum::body::to_bytes(a.into_body(), usize::MAX)
            .await
            .unwrap();
        assert_eq!(got, data);
        assert_eq!(budget.available_permits(), all - units, "b still sends");
        drop(b);
        assert_eq!(budget.available_permits(), all, "given back");
        // No room: refused, and nothing held.
        let filler = reserve(&budget, MAX_ANSWER_BYTES_IN_FLIGHT - CHUNK).unwrap();
        let refused = shared.response(&budget, Default::default());
        assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(refused.headers().contains_key(BUSY_HEADER));
        drop(filler);
        assert_eq!(budget.available_permits(), all);
        // A small answer is not counted.
        let small = SharedAnswer::new(Bytes::from_static(b"[]"));
        let r = small.response(&budget, Default::default());
        assert_eq!(budget.available_permits(), all);
        assert_eq!(r.status(), StatusCode::OK);
    }

    /// Review r36r D1: an answer not kept holds its build's room until its first request
    /// sends it (that request is not refused after the build, even with the budget full),
    /// then the requests that send it share that room, given back when they are done; an
    /// answer dropped unsent gives it back too.
    #[tokio::test]
    async fn a_held_room_goes_to_the_first_request_and_back() {
        let budget = budget();
        let all = budget.available_permits();
        let data: Vec<u8> = (0..(CHUNK * 3)).map(|i| (i % 251) as u8).collect();
        let room = reserve(&budget, MAX_ANSWER_BYTES_IN_FLIGHT).unwrap();
        assert_eq!(budget.available_permits(), 0);
        let shared = SharedAnswer::holding(Bytes::from(data.clone()), Some(room));
        let a = shared.response(&budget, Default::default());
        let b = shared.response(&budget, Default::default());
        assert_eq!(a.status(), StatusCode::OK);
        assert_eq!(b.status(), StatusCode::OK);
        assert_eq!(budget.available_permits(), 0, "held once, by both");
        let got = axum::body::to_bytes(a.into_body(), usize::MAX)
            .await
            .unwrap();
        assert_eq!(got, data);
        drop(b);
        assert_eq!(budget.available_permits(), all, "given back");
        let unsent = SharedAnswer::holding(Bytes::from(data), reserve(&budget, 1));
        drop(unsent);
        assert_eq!(budget.available_permits(), all, "given back unsent");
    }
}
