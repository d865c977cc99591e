//! The hour partition of event objects: `YYYY-MM-DD-HH` in UTC, the part of an object name
//! the history server's file-name pattern requires.

use crate::util::time::{civil_from_days, days_from_civil};

/// A UTC hour, counted from the Unix epoch: the time partition of event objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Hour(pub i64);

impl Hour {
    /// The hour containing `unix_seconds`.
    pub fn from_unix_seconds(unix_seconds: i64) -> Hour {
        Hour(unix_seconds.div_euclid(3600))
    }

    /// `YYYY-MM-DD-HH`, the form the history server's file-name pattern expects.
    pub fn label(&self) -> String {
        let days = self.0.div_euclid(24);
        let hour = self.0.rem_euclid(24);
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
}
