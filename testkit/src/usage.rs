//! What a process cost, from the kernel's own accounting: CPU time (user + system) and the
//! peak resident set, for the benchmarks that compare collectors.
//!
//! While a process runs, [`cpu_seconds`] reads `utime + stime` from `/proc/<pid>/stat` (all
//! threads of the process). When it ends, [`wait_usage`] reaps it with `wait4(2)`, whose
//! `rusage` holds the same CPU times over the whole life and `ru_maxrss`, the peak resident
//! set (`VmHWM` of `/proc/<pid>/status` at exit): so the work a process does while shutting
//! down (a final upload) is counted too, which sampling `/proc` cannot see.

use std::os::unix::process::ExitStatusExt;
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

/// How often [`wait_usage`] looks whether the process has exited.
const POLL: Duration = Duration::from_millis(10);

/// The cost of a whole process life.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    /// CPU seconds in user mode, all threads.
    pub user_s: f64,
    /// CPU seconds in the kernel on its behalf, all threads.
    pub system_s: f64,
    /// Peak resident set in KiB.
    pub max_rss_kib: u64,
}

impl Usage {
    /// User + system CPU seconds.
    pub fn cpu_s(&self) -> f64 {
        self.user_s + self.system_s
    }
}

/// `utime + stime` of a running process, in seconds (`None` when it is gone).
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces; the fields after it start after the last ')'.
    let after = stat.get(stat.rfind(')')? + 2..)?;
    let f: Vec<&str> = after.split(' ').collect();
    // utime and stime are fields 14 and 15 of stat, i.e. 11 and 12 after the name.
    let ticks = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / clock_ticks_per_second())
}

/// `VmHWM` (peak resident set so far) of a running process, in KiB.
pub fn hwm_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf reads a constant of the system; no memory is touched.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// Waits up to `limit` for `child` to exit and reaps it with `wait4`, returning its exit
/// status and what its whole life cost. After `limit` it is killed (and reaped) and the
/// error says so. The child is consumed: once reaped, its pid may belong to someone else.
pub fn wait_usage(child: Child, limit: Duration) -> Result<(ExitStatus, Usage), String> {
    let pid = child.id() as libc::pid_t;
    let deadline = Instant::now() + limit;
    let mut killed = false;
    loop {
        let mut status: libc::c_int = 0;
        // SAFETY: an all-zero rusage is a valid value of this plain C struct.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        let flags = if killed { 0 } else { libc::WNOHANG };
        // SAFETY: `pid` is our own unreaped child; `status` and `ru` are valid for writes.
        let r = unsafe { libc::wait4(pid, &mut status, flags, &mut ru) };
        if r == pid {
            // `child` must not be waited on again: dropping a Child neither waits nor kills.
            drop(child);
            if killed {
                return Err(format!(
                    "process {pid} did not exit within {limit:?}; killed"
                ));
            }
            let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
            return Ok((
                ExitStatus::from_raw(status),
                Usage {
                    user_s: tv(ru.ru_utime),
                    system_s: tv(ru.ru_stime),
                    // Linux reports ru_maxrss in KiB.
                    max_rss_kib: ru.ru_maxrss.max(0) as u64,
                },
            ));
        }
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(format!("wait4({pid}): {e}"));
            }
        }
        if !killed && Instant::now() > deadline {
            // SAFETY: signalling our own unreaped child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            killed = true;
            continue;
        }
        std::thread::sleep(POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn counts_the_cpu_and_memory_of_a_whole_life() {
        // Busy for about 0.3 s of CPU, touching 64 MiB.
        let child = Command::new("python3")
            .args([
                "-c",
                "import time\nb = bytearray(64 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\n\
                 t = time.process_time()\nwhile time.process_time() - t < 0.3: pass",
            ])
            .spawn()
            .expect("python3");
        let (status, u) = wait_usage(child, Duration::from_secs(30)).expect("exit");
        assert!(status.success());
        assert!(u.cpu_s() >= 0.29, "{u:?}");
        assert!(u.max_rss_kib >= 64 << 10, "{u:?}");
    }

    #[test]
    fn kills_a_process_that_outlives_the_limit() {
        let child = Command::new("sleep").arg("30").spawn().expect("sleep");
        let t = Instant::now();
        let e = wait_usage(child, Duration::from_millis(200)).unwrap_err();
        assert!(e.contains("did not exit"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn reads_a_running_process() {
        let pid = std::process::id();
        assert!(cpu_seconds(pid).is_some());
        assert!(hwm_kib(pid).is_some_and(|k| k > 0));
    }
}
