//! The hour partition of event objects: `YYYY-MM-DD-HH` in UTC, the part of an object name
//! the history server's file-name pattern requires.
//!
//! The pattern has room for four-digit years only, so an hour is always between
//! [`Hour::FIRST`] (0000-01-01-00) and [`Hour::LAST`] (9999-12-31-23): a time outside (Ray's
//! RFC 3339 timestamps reach a day beyond either end through their UTC offset) is filed
//! under the nearer end, and the event keeps its timestamp as sent. So every label this
//! module writes parses back ([`Hour::parse_label`]), which recovery needs to place a
//! segment after a restart.

use crate::util::time::{civil_from_days, days_from_civil};

/// A UTC hour, counted from the Unix epoch: the time partition of event objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Hour(pub i64);

/// Hours from the Unix epoch to 0000-01-01T00:00Z, the first hour a label can name.
const FIRST_HOUR: i64 = -62_167_219_200 / 3600;
/// Hours from the Unix epoch to 9999-12-31T23:00Z, the last hour a label can name.
const LAST_HOUR: i64 = (253_402_300_800 / 3600) - 1;

impl Hour {
    /// The first hour a label can name: 0000-01-01-00.
    pub const FIRST: Hour = Hour(FIRST_HOUR);
    /// The last hour a label can name: 9999-12-31-23.
    pub const LAST: Hour = Hour(LAST_HOUR);

    /// The hour containing `unix_seconds`, or the nearer of [`Hour::FIRST`] and
    /// [`Hour::LAST`] when that hour has no four-digit year.
    #[inline]
    pub fn from_unix_seconds(unix_seconds: i64) -> Hour {
        Hour(unix_seconds.div_euclid(3600).clamp(FIRST_HOUR, LAST_HOUR))
    }

    /// `YYYY-MM-DD-HH`, the form the history server's file-name pattern expects (an hour
    /// built outside [`Hour::from_unix_seconds`] is clamped the same way first).
    pub fn label(&self) -> String {
        let days = self.0.clamp(FIRST_HOUR, LAST_HOUR).div_euclid(24);
        let hour = self.0.clamp(FIRST_HOUR, LAST_HOUR).rem_euclid(24);
        let (y, m, d) = civil_from_days(days);
        format!("{y:04}-{m:02}-{d:02}-{hour:02}")
    }

    /// Parses the `YYYY-MM-DD-HH` label back.
    pub fn parse_label(s: &str) -> Option<Hour> {
        let b = s.as_bytes();
        if b.len() != 13 || b[4] != b'-' || b[7] != b'-' || b[10] != b'-' {
            return None;
        }
        let num = |r: std::ops::Range<usize>| -> Option<i64> {
            let t = &s[r];
            if t.bytes().all(|c| c.is_ascii_digit()) {
                t.parse().ok()
            } else {
                None
            }
        };
        let (y, m, d, h) = (num(0..4)?, num(5..7)?, num(8..10)?, num(11..13)?);
        if !(1..=12).contains(&m) || !(1..=31).contains(&d) || h > 23 {
            return None;
        }
        Some(Hour(days_from_civil(y, m as u32, d as u32) * 24 + h))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::time::parse_rfc3339_seconds;

    #[test]
    fn labels_round_trip() {
        let t = parse_rfc3339_seconds("2026-11-22T02:06:40.945470430Z").unwrap();
        assert_eq!(Hour::from_unix_seconds(t).label(), "2026-11-22-02");
        assert_eq!(
            Hour::parse_label("2026-11-22-02"),
            Some(Hour::from_unix_seconds(t))
        );
        assert_eq!(Hour::from_unix_seconds(-1).label(), "1969-12-31-23");
        for bad in [
            "2026-11-22-24",
            "2026-13-22-02",
            "2026-11-22T02",
            "2026-11-22-2",
        ] {
            assert_eq!(Hour::parse_label(bad), None, "{bad}");
        }
    }

    /// Every label the writer can produce parses back to its hour: the hours near both ends
    /// of the range one by one, and a spread of seconds over the whole `i64` range
    /// (xorshift, fixed seed), edges included.
    #[test]
    fn every_label_parses_back() {
        let check = |secs: i64| {
            let h = Hour::from_unix_seconds(secs);
            let label = h.label();
            assert_eq!(label.len(), 13, "{secs}: {label}");
            assert_eq!(Hour::parse_label(&label), Some(h), "{secs}: {label}");
            assert!((Hour::FIRST..=Hour::LAST).contains(&h), "{secs}");
        };
        for hours in 0..100_000i64 {
            check((Hour::FIRST.0 - 50_000 + hours) * 3600);
            check((Hour::LAST.0 - 50_000 + hours) * 3600 + 3599);
        }
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..200_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            check(x as i64);
            // Also a spread over the years a timestamp can name (0000 to 9999, +- a day).
            check(-62_167_305_600 + (x % 315_537_984_000) as i64);
        }
        for secs in [i64::MIN, i64::MIN + 1, -1, 0, 1, i64::MAX - 1, i64::MAX] {
            check(secs);
        }
    }

    /// The edges of what an RFC 3339 timestamp can say are filed under the first and last
    /// hour, which parse back.
    #[test]
    fn timestamps_beyond_the_four_digit_years_are_filed_at_the_ends() {
        let cases = [
            ("0000-01-01T00:30:00+01:00", "0000-01-01-00"),
            ("0000-01-01T00:00:00+23:59", "0000-01-01-00"),
            ("0000-01-01T00:00:00Z", "0000-01-01-00"),
            ("9999-12-31T23:30:00-01:00", "9999-12-31-23"),
            ("9999-12-31T23:59:60-23:59", "9999-12-31-23"),
            ("9999-12-31T23:59:59Z", "9999-12-31-23"),
        ];
        for (ts, want) in cases {
            let h = Hour::from_unix_seconds(parse_rfc3339_seconds(ts).unwrap());
            assert_eq!(h.label(), want, "{ts}");
            assert_eq!(Hour::parse_label(want), Some(h));
        }
    }
}
