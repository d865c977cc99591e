//! The spill files of a big session's task attempts: K files, each attempt's state written
//! to the file its hash picks, in a small binary record format read back by
//! [`read_record`].
//!
//! Each file is unlinked as soon as it is created (and its private directory removed once
//! the K are): only the open descriptors hold them, so the kernel frees them when they are
//! closed, however the process ends — a SIGTERM, a Ctrl-C or a SIGKILL leaves nothing in
//! `TMPDIR` (review r56a D2: a killed `inspect` left 60-80 MB of them), without any signal
//! handler of ours changing how the process dies.
//!
//! Record: the id (length byte, bytes), the attempt (i32), the fixed fields little-endian,
//! then a flag byte and, when set, the rare part (error, log offsets) as length-prefixed
//! strings and optional integers.

use std::fs::File;
use std::io::{BufWriter, Read, Seek, Write};

use super::{AttemptKey, CompactId, LogInfo, Sym, TaskExtra, TaskState};
use crate::util::dedup::PassThroughHasher;

/// Write (and read) buffer of each spill file.
pub(super) const SPILL_BUFFER_BYTES: usize = 16 << 10;

/// K spill files, already unlinked or never named: they live as long as this.
#[derive(Debug)]
pub(super) struct SpillFiles {
    writers: Vec<BufWriter<File>>,
    /// Records written to each file: the reader sizes its map by it.
    records: Vec<u64>,
}

/// A file in `dir` that never has a name (`O_TMPFILE`): nothing for a kill to leave behind
/// (review r56e F3). `None` where the filesystem cannot make one.
#[cfg(target_os = "linux")]
fn unnamed_file(dir: &std::path::Path) -> Option<File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_TMPFILE)
        .mode(0o600)
        .open(dir)
        .ok()
}

#[cfg(not(target_os = "linux"))]
fn unnamed_file(_dir: &std::path::Path) -> Option<File> {
    None
}

impl SpillFiles {
    /// `n` spill files in `TMPDIR`: unnamed ones where the filesystem can, else named in a
    /// private directory and unlinked at once (with the directory): a kill in between is
    /// then the only moment a name exists.
    pub(super) fn create(n: usize) -> std::io::Result<SpillFiles> {
        let base = std::env::temp_dir();
        let mut writers = Vec::with_capacity(n);
        while writers.len() < n {
            match unnamed_file(&base) {
                Some(f) => writers.push(BufWriter::with_capacity(SPILL_BUFFER_BYTES, f)),
                None => break,
            }
        }
        if writers.len() < n {
            let more = n - writers.len();
            named_then_unlinked(&base, more, &mut writers)?;
        }
        Ok(SpillFiles {
            writers,
            records: vec![0; n],
        })
    }

    pub(super) fn write(&mut self, key: &AttemptKey, state: &TaskState) -> std::io::Result<()> {
        let mut hasher = PassThroughHasher::default();
        std::hash::Hash::hash(key, &mut hasher);
        // The high bits: the maps use the low ones.
        let h = std::hash::Hasher::finish(&hasher).rotate_left(32);
        let i = (h % self.writers.len() as u64) as usize;
        self.records[i] += 1;
        write_record(&mut self.writers[i], key, state)
    }

    /// Flushes the files and gives them back, each at its start, to be read once, with the
    /// number of records written to each.
    pub(super) fn finish(self) -> std::io::Result<Vec<(File, u64)>> {
        let mut files = Vec::with_capacity(self.writers.len());
        for (w, records) in self.writers.into_iter().zip(self.records) {
            let mut f = w
                .into_inner()
                .map_err(std::io::IntoInnerError::into_error)?;
            f.rewind()?;
            files.push((f, records));
        }
        Ok(files)
    }
}

/// `n` more spill files named in a private directory of `base`, each unlinked as soon as it
/// is created and the directory removed after: where `O_TMPFILE` is not supported.
fn named_then_unlinked(
    base: &std::path::Path,
    n: usize,
    writers: &mut Vec<BufWriter<File>>,
) -> std::io::Result<()> {
    let mut dir = None;
    for i in 0..100u32 {
        let candidate = base.join(format!(
            "rhc-inspect-{}-{}-{i}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0)
        ));
        match std::fs::create_dir(&candidate) {
            Ok(()) => {
                dir = Some(candidate);
                break;
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    let dir = dir.ok_or_else(|| std::io::Error::other("no free temp directory name"))?;
    let mut made = Ok(());
    for i in 0..n {
        let path = dir.join(format!("attempts-{i}.bin"));
        let opened = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path);
        match opened.and_then(|f| std::fs::remove_file(&path).map(|()| f)) {
            Ok(f) => writers.push(BufWriter::with_capacity(SPILL_BUFFER_BYTES, f)),
            Err(e) => {
                // A file created but not unlinked goes before the directory below.
                let _ = std::fs::remove_file(&path);
                made = Err(e);
                break;
            }
        }
    }
    let _ = std::fs::remove_dir(&dir);
    made
}

fn put_u32(w: &mut impl Write, v: u32) -> std::io::Result<()> {
    w.write_all(&v.to_le_bytes())
}

fn put_str(w: &mut impl Write, s: &Option<String>) -> std::io::Result<()> {
    match s {
        None => put_u32(w, u32::MAX),
        Some(s) => {
            put_u32(w, s.len() as u32)?;
            w.write_all(s.as_bytes())
        }
    }
}

fn put_opt_u64(w: &mut impl Write, v: Option<u64>) -> std::io::Result<()> {
    match v {
        None => w.write_all(&[0]),
        Some(v) => {
            w.write_all(&[1])?;
            w.write_all(&v.to_le_bytes())
        }
    }
}

pub(super) fn write_record(
    w: &mut impl Write,
    key: &AttemptKey,
    s: &TaskState,
) -> std::io::Result<()> {
    // The id and the fixed part in one write (a write per field was most of the spill's time).
    let (len, bytes) = key.id.raw();
    let mut record = [0u8; 1 + 31 + FIXED_BYTES];
    let mut at = 0;
    let mut put = |b: &[u8]| {
        record[at..at + b.len()].copy_from_slice(b);
        at += b.len();
    };
    put(&[len]);
    put(bytes);
    put(&key.attempt.to_le_bytes());
    for v in [
        s.latest_ns,
        s.running_ns,
        s.failed_ns,
        s.exec_start,
        s.exec_end,
    ] {
        put(&v.to_le_bytes());
    }
    for v in [
        s.latest_state,
        s.exec_worker,
        s.job,
        s.name,
        s.task_type,
        s.node,
        s.worker,
        s.resources,
    ] {
        put(&v.0.to_le_bytes());
    }
    put(&s.pid.to_le_bytes());
    put(&[s.latest_rank, u8::from(s.known)]);
    w.write_all(&record[..at])?;
    match &s.extra {
        None => w.write_all(&[0]),
        Some(e) => {
            w.write_all(&[1
                | (u8::from(e.error_from_failed) << 1)
                | (u8::from(e.log.is_some()) << 2)])?;
            put_str(w, &e.error_type)?;
            put_str(w, &e.error_message)?;
            if let Some(l) = &e.log {
                put_str(w, &l.stdout_file)?;
                put_str(w, &l.stderr_file)?;
                for v in [l.stdout.0, l.stdout.1, l.stderr.0, l.stderr.1] {
                    put_opt_u64(w, v)?;
                }
            }
            Ok(())
        }
    }
}

/// A record's fixed part after its id: the attempt, five times, nine symbols and numbers,
/// the rank, `known` and the flags ([`write_record`]'s order).
const FIXED_BYTES: usize = 4 + 5 * 8 + 9 * 4 + 3;

struct Fixed {
    bytes: [u8; FIXED_BYTES],
    at: usize,
}

impl Fixed {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let mut b = [0u8; N];
        b.copy_from_slice(&self.bytes[self.at..self.at + N]);
        self.at += N;
        b
    }
    fn i64(&mut self) -> i64 {
        i64::from_le_bytes(self.take::<8>())
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take::<4>())
    }
}

struct RecordReader<'a, R: Read>(&'a mut R);

impl<R: Read> RecordReader<'_, R> {
    fn bytes<const N: usize>(&mut self) -> std::io::Result<[u8; N]> {
        let mut b = [0u8; N];
        self.0.read_exact(&mut b)?;
        Ok(b)
    }
    fn u32(&mut self) -> std::io::Result<u32> {
        Ok(u32::from_le_bytes(self.bytes::<4>()?))
    }
    fn string(&mut self) -> std::io::Result<Option<String>> {
        let n = self.u32()?;
        if n == u32::MAX {
            return Ok(None);
        }
        let mut buf = vec![0u8; n as usize];
        self.0.read_exact(&mut buf)?;
        String::from_utf8(buf)
            .map(Some)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
    }
    fn opt_u64(&mut self) -> std::io::Result<Option<u64>> {
        Ok(match self.bytes::<1>()?[0] {
            0 => None,
            _ => Some(u64::from_le_bytes(self.bytes::<8>()?)),
        })
    }
}

/// The next record, or `None` at the end of the file.
pub(super) fn read_record(r: &mut impl Read) -> std::io::Result<Option<(AttemptKey, TaskState)>> {
    let mut len = [0u8; 1];
    if r.read(&mut len)? == 0 {
        return Ok(None);
    }
    let mut rr = RecordReader(r);
    let n = usize::from(len[0] & 0x7f).min(31);
    let mut bytes = [0u8; 31];
    rr.0.read_exact(&mut bytes[..n])?;
    let id = CompactId::from_raw(len[0], &bytes[..n]);
    // The fixed part in one read (a read per field was most of the time of the final pass).
    let mut fixed = Fixed {
        bytes: rr.bytes::<FIXED_BYTES>()?,
        at: 0,
    };
    let attempt = i32::from_le_bytes(fixed.take::<4>());
    let mut s = TaskState {
        latest_ns: fixed.i64(),
        running_ns: fixed.i64(),
        failed_ns: fixed.i64(),
        exec_start: fixed.i64(),
        exec_end: fixed.i64(),
        ..TaskState::default()
    };
    s.latest_state = Sym(fixed.u32());
    s.exec_worker = Sym(fixed.u32());
    s.job = Sym(fixed.u32());
    s.name = Sym(fixed.u32());
    s.task_type = Sym(fixed.u32());
    s.node = Sym(fixed.u32());
    s.worker = Sym(fixed.u32());
    s.resources = Sym(fixed.u32());
    s.pid = fixed.u32();
    let [rank, known, flags] = fixed.take::<3>();
    s.latest_rank = rank;
    s.known = known != 0;
    if flags & 1 != 0 {
        let mut e = TaskExtra {
            error_from_failed: flags & 2 != 0,
            error_type: rr.string()?,
            error_message: rr.string()?,
            log: None,
        };
        if flags & 4 != 0 {
            let mut l = LogInfo {
                stdout_file: rr.string()?,
                stderr_file: rr.string()?,
                ..LogInfo::default()
            };
            l.stdout = (rr.opt_u64()?, rr.opt_u64()?);
            l.stderr = (rr.opt_u64()?, rr.opt_u64()?);
            e.log = Some(l);
        }
        s.extra = Some(Box::new(e));
    }
    Ok(Some((AttemptKey { id, attempt }, s)))
}
