//! Values people write in flags and environment variables: byte sizes (`64MiB`), durations
//! in Go's syntax (what KubeRay's variables use: `5m`, `1h30m`, `500ms`) and booleans.
//!
//! Each parser returns a short message for the caller to prefix with the flag or variable and
//! the value, so every configuration error names what was wrong and where.

use std::time::Duration;

/// Parses a byte size: `1048576`, `64MiB`, `64Mi`, `64M` (binary), `64MB` (decimal), `1GiB`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err("expected a size such as 1048576, 512KiB, 64MiB or 1GiB".into());
    }
    let n: u64 = num.parse().map_err(|_| "number too large".to_string())?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "ki" | "kib" => 1 << 10,
        "m" | "mi" | "mib" => 1 << 20,
        "g" | "gi" | "gib" => 1 << 30,
        "t" | "ti" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        other => {
            return Err(format!(
                "unknown size unit {other:?} (use KiB, MiB, GiB, or KB, MB, GB)"
            ))
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| "size too large".to_string())
}

/// Parses a duration in Go's syntax (what KubeRay's variables use): `5m`, `30s`, `1h30m`,
/// `500ms`, `5m0s`, `1.5s`; a bare number is seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let err = || format!("expected a duration such as 30s, 5m, 1h30m or 500ms, got {t:?}");
    if t.is_empty() {
        return Err(err());
    }
    if let Ok(secs) = t.parse::<f64>() {
        if secs.is_finite() && secs >= 0.0 {
            return Ok(Duration::from_secs_f64(secs));
        }
        return Err(err());
    }
    let mut total = 0f64;
    let mut rest = t;
    while !rest.is_empty() {
        let n_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(err)?;
        if n_end == 0 {
            return Err(err());
        }
        let n: f64 = rest[..n_end].parse().map_err(|_| err())?;
        rest = &rest[n_end..];
        let u_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = match &rest[..u_end] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(err()),
        };
        total += n * unit;
        rest = &rest[u_end..];
    }
    if !total.is_finite() || total > 1e9 {
        return Err(err());
    }
    Ok(Duration::from_secs_f64(total))
}

pub fn parse_bool(s: &str) -> Result<bool, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "1" | "t" | "true" | "yes" | "on" => Ok(true),
        "0" | "f" | "false" | "no" | "off" => Ok(false),
        _ => Err("expected true or false".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_durations() {
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_size("64Mi").unwrap(), 64 << 20);
        assert_eq!(parse_size("5MB").unwrap(), 5_000_000);
        assert_eq!(parse_size("123").unwrap(), 123);
        assert!(
            parse_size("MiB").is_err()
                && parse_size("1 parsec").is_err()
                && parse_size("-1").is_err()
        );
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("5m0s").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("30").unwrap(), Duration::from_secs(30));
        for bad in ["", "m", "5x", "-5s", "5 m", "inf"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
