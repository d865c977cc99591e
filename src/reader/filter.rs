//! `--job`, `--since` and `--until`: which objects are read and which events are kept.
//! Times are UTC; a date or an hour means the whole of it, and the hour partitions read are
//! widened by one hour on each side (KubeRay names its objects by creation time, not by the
//! events' own time).

use crate::contract::{self, Hour};

use super::error::ReadError;
use crate::cli::InspectArgs;

/// `--job`, `--since` and `--until`, checked once.
#[derive(Debug, Clone, Default)]
pub(crate) struct Filter {
    pub(super) job: Option<String>,
    pub(super) window: TimeWindow,
    /// `--until` for people: the instant given, or the end of the day or hour given.
    pub(super) until_shown: Option<i64>,
    /// The bucket as given on the command line (one shell word, with `--storage-root-dir`
    /// when set), for the commands a report suggests.
    pub(super) storage_arg: String,
    /// `--pending-after`, in nanoseconds.
    pub(super) pending_after_ns: i64,
}

impl Filter {
    pub(crate) fn from_args(args: &InspectArgs) -> Result<Filter, ReadError> {
        let job = match &args.job {
            None => None,
            Some(j) => {
                if args.session.is_none() {
                    return Err(ReadError::BadArgument {
                        flag: "--job",
                        value: j.clone(),
                        reason: "needs --session (a session name, or latest)",
                    });
                }
                Some(
                    contract::id_to_hex(j.trim())
                        .map_err(|_| ReadError::BadArgument {
                            flag: "--job",
                            value: j.clone(),
                            reason: "not a job id in hex or base64",
                        })?
                        .as_str()
                        .to_string(),
                )
            }
        };
        let since = args
            .since
            .as_deref()
            .map(|s| parse_time_arg("--since", s).map(|(start, _)| start))
            .transpose()?;
        let until = args
            .until
            .as_deref()
            .map(|s| parse_time_arg("--until", s))
            .transpose()?;
        let until_shown = until.map(|(start, end)| if end - start == 1 { start } else { end });
        let until = until.map(|(_, end)| end);
        if let (Some(s), Some(u)) = (since, until) {
            if s >= u {
                return Err(ReadError::BadArgument {
                    flag: "--until",
                    value: args.until.clone().unwrap_or_default(),
                    reason: "is not after --since",
                });
            }
        }
        let mut storage_arg = shell_word(&args.storage);
        if !args.storage_root_dir.is_empty() {
            storage_arg.push_str(" --storage-root-dir ");
            storage_arg.push_str(&shell_word(&args.storage_root_dir));
        }
        Ok(Filter {
            pending_after_ns: i64::try_from(args.pending_after.as_nanos()).unwrap_or(i64::MAX),
            storage_arg,
            job,
            window: TimeWindow {
                since_ns: since,
                until_ns: until,
            },
            until_shown,
        })
    }
}

/// `[since, until)` in Unix nanoseconds; either end open.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct TimeWindow {
    pub(super) since_ns: Option<i64>,
    pub(super) until_ns: Option<i64>,
}

pub(crate) const NANOS_PER_SECOND: i64 = 1_000_000_000;
pub(super) const NANOS_PER_HOUR: i64 = 3600 * NANOS_PER_SECOND;

impl TimeWindow {
    pub(super) fn is_open(&self) -> bool {
        self.since_ns.is_none() && self.until_ns.is_none()
    }

    pub(super) fn contains(&self, time_ns: Option<i64>) -> bool {
        if self.is_open() {
            return true;
        }
        let Some(t) = time_ns else {
            return false;
        };
        self.since_ns.is_none_or(|s| t >= s) && self.until_ns.is_none_or(|u| t < u)
    }

    /// Whether an object of hour partition `hour` may hold events of the window. The hour in
    /// a name is the events' hour (this collector) or the file's creation hour (KubeRay: its
    /// events may be a few minutes later), so one hour of slack is allowed on each side.
    pub(super) fn selects_hour(&self, hour: Hour) -> bool {
        let first = self
            .since_ns
            .map(|s| s.div_euclid(NANOS_PER_HOUR) - 1)
            .unwrap_or(i64::MIN);
        let last = self
            .until_ns
            .map(|u| u.saturating_sub(1).div_euclid(NANOS_PER_HOUR) + 1)
            .unwrap_or(i64::MAX);
        (first..=last).contains(&hour.0)
    }

    /// Whether the hour span `[from, until)` (nanoseconds) overlaps the window.
    pub(super) fn overlaps(&self, from_ns: i64, until_ns: i64) -> bool {
        self.since_ns.is_none_or(|s| until_ns > s) && self.until_ns.is_none_or(|u| from_ns < u)
    }
}

/// Parses `--since`/`--until`: RFC 3339, `YYYY-MM-DD` or `YYYY-MM-DDTHH` (UTC). Returns the
/// start and the (exclusive) end of the period named: a day, an hour, or one nanosecond.
pub(crate) fn parse_time_arg(flag: &'static str, s: &str) -> Result<(i64, i64), ReadError> {
    let bad = || ReadError::BadArgument {
        flag,
        value: s.to_string(),
        reason: "expected RFC 3339 (2026-11-22T02:06:00Z), YYYY-MM-DD or YYYY-MM-DDTHH",
    };
    let t = s.trim();
    let b = t.as_bytes();
    let period = match b.len() {
        10 => Hour::parse_label(&format!("{t}-00")).map(|h| (h, 24)),
        13 if matches!(b[10], b'T' | b't' | b' ') => {
            Hour::parse_label(&format!("{}-{}", &t[..10], &t[11..])).map(|h| (h, 1))
        }
        _ => None,
    };
    if let Some((hour, hours)) = period {
        let start = hour.0.saturating_mul(NANOS_PER_HOUR);
        return Ok((start, start.saturating_add(hours * NANOS_PER_HOUR)));
    }
    let ns = parse_time_ns(t).ok_or_else(bad)?;
    Ok((ns, ns.saturating_add(1)))
}

/// An RFC 3339 timestamp as Unix nanoseconds (fractional digits beyond 9 are dropped).
pub(crate) fn parse_time_ns(s: &str) -> Option<i64> {
    let seconds = crate::util::time::parse_rfc3339_seconds(s)?;
    let b = s.as_bytes();
    let mut fraction: i64 = 0;
    if b.get(19) == Some(&b'.') {
        // No list of the digits (this runs for every timestamp of every event).
        let mut scale = 100_000_000;
        for d in b[20..].iter().take_while(|c| c.is_ascii_digit()).take(9) {
            fraction += i64::from(d - b'0') * scale;
            scale /= 10;
        }
    }
    seconds.checked_mul(NANOS_PER_SECOND)?.checked_add(fraction)
}

/// `s` as one shell word (quoted when it holds anything but plain path characters).
pub(super) fn shell_word(s: &str) -> String {
    let plain = !s.is_empty()
        && s.bytes()
            .all(|c| c.is_ascii_alphanumeric() || b"/._:-=@%+,".contains(&c));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_arguments() {
        let hour = |l: &str| Hour::parse_label(l).unwrap().0 * NANOS_PER_HOUR;
        assert_eq!(
            parse_time_arg("--since", "2026-11-22").unwrap(),
            (hour("2026-11-22-00"), hour("2026-11-23-00"))
        );
        assert_eq!(
            parse_time_arg("--since", "2026-11-22T02").unwrap(),
            (hour("2026-11-22-02"), hour("2026-11-22-03"))
        );
        let t = parse_time_arg("--until", "2026-11-22T02:06:40.5Z").unwrap();
        assert_eq!(
            t.0,
            hour("2026-11-22-02") + 400 * NANOS_PER_SECOND + 500_000_000
        );
        assert_eq!(t.1, t.0 + 1);
        assert!(parse_time_arg("--since", "yesterday").is_err());
        assert!(parse_time_arg("--since", "2026-11-22T2").is_err());
    }

    #[test]
    fn window_selects_hours_with_slack() {
        let h = |l: &str| Hour::parse_label(l).unwrap();
        let (since, _) = parse_time_arg("--since", "2026-11-22T05").unwrap();
        let (_, until) = parse_time_arg("--until", "2026-11-22T06").unwrap();
        let w = TimeWindow {
            since_ns: Some(since),
            until_ns: Some(until),
        };
        assert!(!w.selects_hour(h("2026-11-22-03")));
        assert!(w.selects_hour(h("2026-11-22-04")));
        assert!(w.selects_hour(h("2026-11-22-07")));
        assert!(!w.selects_hour(h("2026-11-22-08")));
        assert!(TimeWindow::default().selects_hour(h("1970-01-01-00")));
        assert!(w.contains(Some(since)));
        assert!(!w.contains(Some(until)));
        assert!(!w.contains(None));
        assert!(TimeWindow::default().contains(None));
    }
}
