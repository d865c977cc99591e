//! The I/O fault shim (`tests/fault_shim/fault_shim.c`), compiled for the test that needs it
//! with `cc` and loaded into the collector with `LD_PRELOAD`. A rule file
//! `<dir>/<call>` (`open`, `openr`, `fsync`, `fdatasync`, `ftruncate`, `write`, `writev`)
//! holding `<errno> <count> <text>` makes the next `count` such calls on a path containing
//! `text` (ending with it, when `text` ends with `$`) fail with `errno`; the shim deletes the
//! rule when it is used up. The errno `-9` ([`KILL`]) is a kill -9 at the `count`th matching
//! call instead (the ones before it go through): a crash at a chosen step. A `write` fails as on a disk that fills up: half of its bytes are
//! written and the short count returned, then the next write to that descriptor fails.
//! A `syncfs` (how the spool syncs a group of more than 32 files) can be failed the same way
//! (rule `syncfs`); one that succeeds counts every file below the spool as synced for
//! [`Faults::lose_unsynced`].
//! [`Faults::hide_birth_times`] makes `statx` answer without a birth time, and
//! [`Faults::pause_at_stat`] holds one `statx` until the test says [`Faults::resume`].
//! Needs a C compiler and a dynamically linked glibc binary.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::repo_root;

/// The "errno" of a rule that kills the process (SIGKILL, sent to itself) at the `count`th
/// matching call, before the call is made.
pub const KILL: i32 = -9;

/// The shim, built into a test's temp dir, and its rule directory.
pub struct Faults {
    /// Where the rules go (`RHC_FAULT_DIR`).
    pub dir: PathBuf,
    /// The shared object (`LD_PRELOAD`).
    pub lib: PathBuf,
}

impl Faults {
    /// Builds the shim into `tmp` (`tmp/fault_shim.so`, rules in `tmp/faults/`); panics with
    /// the compiler's output if that fails.
    pub fn build(tmp: &Path) -> Faults {
        let dir = tmp.join("faults");
        std::fs::create_dir_all(&dir).expect("create the fault rule dir");
        let lib = tmp.join("fault_shim.so");
        let src = repo_root().join("tests/fault_shim/fault_shim.c");
        let out = Command::new("cc")
            .args(["-shared", "-fPIC", "-O1", "-o"])
            .arg(&lib)
            .arg(&src)
            .args(["-ldl", "-pthread"])
            .output()
            .expect("running cc to build the fault shim");
        assert!(
            out.status.success(),
            "building the fault shim: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Faults { dir, lib }
    }

    /// The environment that loads the shim with these rules.
    pub fn env(&self) -> Vec<(&str, &str)> {
        vec![
            ("LD_PRELOAD", self.lib.to_str().expect("utf-8 temp path")),
            ("RHC_FAULT_DIR", self.dir.to_str().expect("utf-8 temp path")),
        ]
    }

    /// The next `count` calls of `call` on a path containing `text` fail with `errno`.
    pub fn arm(&self, call: &str, errno: i32, count: u32, text: &str) {
        std::fs::write(self.dir.join(call), format!("{errno} {count} {text}\n"))
            .expect("write a fault rule");
    }

    /// From now on `statx` answers without a birth time, as on a filesystem that records
    /// none (ext4 with 128-byte inodes, NFS): how a test covers that case on any filesystem.
    pub fn hide_birth_times(&self) {
        std::fs::write(self.dir.join("nobtime"), b"").expect("write the nobtime rule");
    }

    /// The `nth` (from 1) lstat-like `statx` (Rust's `fs::symlink_metadata` and a directory
    /// listing's metadata, not the following stat of a directory watcher's walk) on a path
    /// matching `text` (as in [`Faults::arm`]) waits until [`Faults::resume`];
    /// [`Faults::wait_paused`] waits until it does.
    pub fn pause_at_stat(&self, nth: u32, text: &str) {
        let _ = std::fs::remove_file(self.dir.join("resume"));
        std::fs::write(self.dir.join("pause"), format!("{nth} {text}\n"))
            .expect("write the pause rule");
    }

    /// Whether a call paused by [`Faults::pause_at_stat`] is waiting (or was), within `limit`.
    pub fn wait_paused(&self, limit: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + limit;
        while !self.dir.join("paused").exists() {
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        true
    }

    /// Lets the call paused by [`Faults::pause_at_stat`] go on.
    pub fn resume(&self) {
        std::fs::write(self.dir.join("resume"), b"").expect("write the resume file");
    }

    /// Removes the rule for `call`, used up or not.
    pub fn disarm(&self, call: &str) {
        let _ = std::fs::remove_file(self.dir.join(call));
    }

    /// Whether the rule for `call` is still there (not used up).
    pub fn armed(&self, call: &str) -> bool {
        self.dir.join(call).exists()
    }

    /// Simulates a power loss on the files below `dir` (the process stopped): each regular
    /// file is cut to its size at its last successful `fsync`/`fdatasync` (or `syncfs` of the
    /// spool, at the size it had then) the shim saw (by device and inode, so a file synced under a temporary name and renamed counts), and a
    /// file never synced is emptied. What the page cache alone held is gone; the rest stays.
    /// Returns the files cut, with their lengths before and after.
    pub fn lose_unsynced(&self, dir: &Path) -> Vec<(PathBuf, u64, u64)> {
        use std::os::unix::fs::MetadataExt;
        let mut durable: std::collections::HashMap<(u64, u64), u64> =
            std::collections::HashMap::new();
        for line in std::fs::read_to_string(self.dir.join("synced"))
            .unwrap_or_default()
            .lines()
        {
            let w: Vec<u64> = line.split(' ').filter_map(|x| x.parse().ok()).collect();
            if let [dev, ino, size] = w[..] {
                durable.insert((dev, ino), size);
            }
        }
        let mut cut = Vec::new();
        for path in crate::collector::files_under(dir) {
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            if !meta.is_file() {
                continue;
            }
            let keep = durable.get(&(meta.dev(), meta.ino())).copied().unwrap_or(0);
            if meta.len() > keep {
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .expect("open a file to cut");
                f.set_len(keep).expect("cut a file to its synced size");
                cut.push((path, meta.len(), keep));
            }
        }
        cut
    }

    /// The shim's log: (call, path, ok).
    pub fn log(&self) -> Vec<(String, String, bool)> {
        std::fs::read_to_string(self.dir.join("log"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let mut it = l.rsplitn(2, ' ');
                let ok = it.next()? == "ok";
                let (call, path) = it.next()?.split_once(' ')?;
                Some((call.to_string(), path.to_string(), ok))
            })
            .collect()
    }
}
