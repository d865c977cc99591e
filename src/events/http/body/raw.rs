//! The bytes of a body as they arrive ([`RawBody`]): on the heap while small, charged for
//! the buffer's capacity, then in a private anonymous mapping of their own ([`Mapped`]) past
//! [`MAPPED_FROM`], charged for the bytes written. Never copied once mapped; unmapped whole
//! when the body is dropped.

use bytes::Bytes;

use super::budget::RESERVE_STEP;

/// The capacity to give a buffer of `cap` bytes that must hold `need`: doubling from
/// [`RESERVE_STEP`] (so copies stay linear in the size), never beyond `limit` unless `need`
/// is. The capacity is what is charged (see the module docs).
fn grown(cap: usize, need: usize, limit: usize) -> usize {
    cap.saturating_mul(2)
        .max(RESERVE_STEP as usize)
        .min(limit)
        .max(need)
}

/// A body past this size moves from the heap to a mapping of its own ([`Mapped`]).
const MAPPED_FROM: usize = 256 << 10;

/// The bytes of a body as they arrive: on the heap while small (Ray's batches of tens of
/// KB), then in a mapping of its own ([`Mapped`]); at once when its `Content-Length` is past
/// [`MAPPED_FROM`]. A heap buffer grown by doubling is
/// charged for its capacity: memory the allocator hands out again was written before, so
/// its spare capacity is resident too, and the chunks it leaves behind as it grows stay in
/// the heap (review r39k D2: 272 bodies of 1 MiB, each charged for its bytes, took VmHWM to
/// 232 MiB beside a 96 MiB budget). A mapping is never copied nor grown, holds fresh pages
/// that become resident only as they are written, and goes back to the system whole when
/// the body is dropped, so it is charged for the bytes written.
pub(super) enum RawBody {
    Heap(Vec<u8>),
    Mapped(Mapped),
}

impl RawBody {
    /// A buffer for a body that declared `declared` bytes: mapped at once when that is past
    /// [`MAPPED_FROM`], so a large body never leaves heap buffers behind as it grows.
    pub(super) fn new(declared: Option<usize>) -> RawBody {
        match declared {
            Some(d) if d > MAPPED_FROM => match Mapped::new(d) {
                Ok(m) => RawBody::Mapped(m),
                Err(_) => RawBody::Heap(Vec::new()),
            },
            _ => RawBody::Heap(Vec::new()),
        }
    }

    pub(super) fn len(&self) -> usize {
        match self {
            RawBody::Heap(v) => v.len(),
            RawBody::Mapped(m) => m.len,
        }
    }

    /// What the buffer holds, as charged, once it holds `need` bytes of a body of at most
    /// `limit`.
    pub(super) fn charge_for(&self, need: usize, limit: usize) -> u64 {
        match self {
            RawBody::Heap(v) if need <= MAPPED_FROM || limit <= MAPPED_FROM => {
                let cap = if need > v.capacity() {
                    grown(v.capacity(), need, limit)
                } else {
                    v.capacity()
                };
                cap as u64
            }
            _ => need as u64,
        }
    }

    /// Appends `data` (`need` bytes in all, of a body of at most `limit`).
    pub(super) fn extend(&mut self, data: &[u8], need: usize, limit: usize) {
        if let RawBody::Heap(v) = self {
            if need > MAPPED_FROM && limit > MAPPED_FROM {
                if let Ok(mut m) = Mapped::new(limit.max(need)) {
                    m.extend(v);
                    *self = RawBody::Mapped(m);
                }
            }
        }
        match self {
            RawBody::Heap(v) => {
                if need > v.capacity() {
                    v.reserve_exact(grown(v.capacity(), need, limit) - v.len());
                }
                v.extend_from_slice(data);
            }
            RawBody::Mapped(m) => m.extend(data),
        }
    }

    pub(super) fn into_bytes(self) -> Bytes {
        match self {
            RawBody::Heap(v) => Bytes::from(v),
            RawBody::Mapped(m) => Bytes::from_owner(m),
        }
    }
}

/// A private anonymous mapping of a fixed capacity (address space, reserving no swap) that
/// is filled from its start; unmapped when dropped.
pub(super) struct Mapped {
    ptr: std::ptr::NonNull<u8>,
    cap: usize,
    len: usize,
}

// SAFETY: the mapping is owned by this value alone; its bytes are written only through
// `&mut self` and read through `&self`.
unsafe impl Send for Mapped {}
// SAFETY: as above: `&self` only reads.
unsafe impl Sync for Mapped {}

impl Mapped {
    #[cfg(unix)]
    fn new(cap: usize) -> std::io::Result<Mapped> {
        // SAFETY: a new private anonymous mapping, which nothing else refers to.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                cap.max(1),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let ptr = std::ptr::NonNull::new(p.cast::<u8>())
            .ok_or_else(|| std::io::Error::other("mmap returned null"))?;
        Ok(Mapped { ptr, cap, len: 0 })
    }

    #[cfg(not(unix))]
    fn new(_cap: usize) -> std::io::Result<Mapped> {
        Err(std::io::Error::from(std::io::ErrorKind::Unsupported))
    }

    /// Appends `data`; the caller never passes the capacity (the body's limit), and what
    /// would is cut off.
    fn extend(&mut self, data: &[u8]) {
        let n = data.len().min(self.cap - self.len);
        // SAFETY: `len + n <= cap`, inside the mapping; `data` is not in it (only `&mut
        // self` writes there).
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(self.len), n);
        }
        self.len += n;
    }
}

impl AsRef<[u8]> for Mapped {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the first `len` bytes of the mapping were written by `extend`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        #[cfg(unix)]
        // SAFETY: the mapping made in `new`, of that length, unmapped once.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.cap.max(1));
        }
    }
}
