//! A filesystem without birth times: a small ext4 image made with 128-byte inodes (which
//! have no room for `crtime`), loop-mounted in a test's temp dir. Needs root, loop devices
//! and `mkfs.ext4`; [`NoBirthTimeFs::mount`] says why when it cannot mount one, so the test can
//! say it was skipped. Unmounted (lazily) when dropped.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Bytes of the image (sparse).
const IMAGE_BYTES: &str = "128M";

/// A mounted ext4 without birth times.
pub struct NoBirthTimeFs {
    /// Where it is mounted.
    pub dir: PathBuf,
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd:?}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl NoBirthTimeFs {
    /// Makes and mounts the image under `tmp`; `Err` says why it could not (no root, no loop
    /// device, no `mkfs.ext4`), or that the mounted filesystem records birth times after all.
    pub fn mount(tmp: &Path) -> Result<NoBirthTimeFs, String> {
        let img = tmp.join("nobtime.img");
        let dir = tmp.join("nobtime");
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        run(Command::new("truncate")
            .arg("-s")
            .arg(IMAGE_BYTES)
            .arg(&img))?;
        run(Command::new("mkfs.ext4")
            .args(["-q", "-F", "-I", "128"])
            .arg(&img))?;
        run(Command::new("mount")
            .args(["-o", "loop"])
            .arg(&img)
            .arg(&dir))?;
        let fs = NoBirthTimeFs { dir };
        let probe = fs.dir.join("probe");
        std::fs::write(&probe, b"").map_err(|e| e.to_string())?;
        if std::fs::metadata(&probe)
            .map_err(|e| e.to_string())?
            .created()
            .is_ok()
        {
            return Err("the loop-mounted ext4 records birth times after all".into());
        }
        Ok(fs)
    }
}

impl Drop for NoBirthTimeFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).output();
    }
}
