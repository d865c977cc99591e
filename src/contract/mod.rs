//! The bucket layout that KubeRay's history server reads, byte for byte.
//!
//! Everything that turns names (cluster, owner, session, node, job, hour) into object keys
//! lives here, so the compatibility contract with the history server is in one place and
//! is unit-tested against the reader's expectations.

use std::fmt;

/// Longest id or session name we accept as a single path segment.
pub const MAX_SEGMENT_LEN: usize = 128;

/// Which Kubernetes object owns the Ray cluster; decides the `cluster-history/<kind>/...` prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// A bare RayCluster.
    RayCluster,
    /// A RayCluster created by the named RayJob.
    RayJob(String),
    /// A RayCluster created by the named RayService.
    RayService(String),
}

impl Owner {
    /// Directory name of the owner kind in both key families.
    pub fn kind_dir(&self) -> &'static str {
        match self {
            Owner::RayCluster => "raycluster",
            Owner::RayJob(_) => "rayjob",
            Owner::RayService(_) => "rayservice",
        }
    }

    fn name(&self) -> Option<&str> {
        match self {
            Owner::RayCluster => None,
            Owner::RayJob(n) | Owner::RayService(n) => Some(n),
        }
    }
}

/// Identity of the cluster whose history we write, and the optional root inside the bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterLayout {
    /// Prefix inside the bucket, without leading or trailing '/'; empty for none.
    pub root: String,
    /// Kubernetes namespace of the RayCluster.
    pub namespace: String,
    /// Name of the RayCluster.
    pub cluster: String,
    /// Owner of the RayCluster.
    pub owner: Owner,
}

impl ClusterLayout {
    fn with_root(&self, rest: &str) -> String {
        if self.root.is_empty() {
            rest.to_string()
        } else {
            format!("{}/{}", self.root, rest)
        }
    }

    /// `<family>/<kind>/<ns>/[<owner>/]<cluster>` under the root: the shape shared by the
    /// history prefix and the quarantine prefix.
    fn cluster_path(&self, family: &str) -> String {
        let owner = self
            .owner
            .name()
            .map(|o| format!("{o}/"))
            .unwrap_or_default();
        self.with_root(&format!(
            "{family}/{}/{}/{owner}{}",
            self.owner.kind_dir(),
            self.namespace,
            self.cluster
        ))
    }

    /// `P` of the design notes: `[<root>/]cluster-history/<kind>/<ns>/[<owner>/]<cluster>`.
    pub fn history_prefix(&self) -> String {
        self.cluster_path("cluster-history")
    }

    /// The empty object that makes a session visible in the history server.
    pub fn session_marker_key(&self, session: &str) -> String {
        let joined = match self.owner.name() {
            Some(owner) => format!("{}_{}_{}", self.namespace, owner, self.cluster),
            None => format!("{}_{}", self.namespace, self.cluster),
        };
        self.with_root(&format!(
            "cluster-metadata/{}/{}/{}",
            self.owner.kind_dir(),
            joined,
            session
        ))
    }

    /// Where input we could not use is kept, per cluster: not read by the history server.
    pub fn quarantine_prefix(&self) -> String {
        self.cluster_path("collector-quarantine")
    }
}

/// True if `s` can be used verbatim as one path segment in a key and in the spool.
///
/// Same rule as KubeRay's session-name check: `^[A-Za-z0-9._-]+$`, not `.` or `..`, bounded length.
pub fn is_safe_segment(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_SEGMENT_LEN
        && s != "."
        && s != ".."
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
}

/// DNS-1123 subdomain, what Kubernetes allows for cluster, namespace and owner names.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    if s.is_empty() || s.len() > 253 {
        return false;
    }
    s.split('.').all(|label| {
        let b = label.as_bytes();
        !b.is_empty()
            && b.iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
            && b[0] != b'-'
            && b[b.len() - 1] != b'-'
    })
}

/// A Ray id (node, job) rendered as lower-case hex, held inline so routing never allocates.
#[derive(Clone, Copy)]
pub struct HexId {
    len: u8,
    buf: [u8; MAX_SEGMENT_LEN],
}

impl HexId {
    /// The hex text.
    pub fn as_str(&self) -> &str {
        // Only ASCII hex digits are ever written into `buf`.
        std::str::from_utf8(&self.buf[..self.len as usize]).unwrap_or("")
    }
}

impl fmt::Debug for HexId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why an id could not be turned into hex.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// Neither hex nor base64.
    #[error("neither hex nor base64")]
    NotAnId,
    /// Decodes, but to more bytes than a path segment may hold.
    #[error("longer than {MAX_SEGMENT_LEN} hex digits")]
    TooLong,
}

/// Converts a Ray id as it appears in events to lower-case hex.
///
/// Ray sends ids as standard base64 (`AQAAAA==` → `01000000`); URL-safe and unpadded base64
/// are tolerated like KubeRay does. A string made only of hex digits with an even length is
/// taken to be hex already and is only lower-cased: Ray's base64 job and node ids always carry
/// padding, so they never look like that.
pub fn id_to_hex(id: &str) -> Result<HexId, IdError> {
    let b = id.as_bytes();
    let mut out = HexId {
        len: 0,
        buf: [0; MAX_SEGMENT_LEN],
    };
    if !b.is_empty() && b.len() % 2 == 0 && b.iter().all(|c| c.is_ascii_hexdigit()) {
        if b.len() > MAX_SEGMENT_LEN {
            return Err(IdError::TooLong);
        }
        for (o, c) in out.buf.iter_mut().zip(b) {
            *o = c.to_ascii_lowercase();
        }
        out.len = b.len() as u8;
        return Ok(out);
    }
    let mut raw = [0u8; MAX_SEGMENT_LEN];
    let n = decode_base64(b, &mut raw)?;
    if n * 2 > MAX_SEGMENT_LEN {
        return Err(IdError::TooLong);
    }
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for (i, byte) in raw[..n].iter().enumerate() {
        out.buf[2 * i] = HEX[(byte >> 4) as usize];
        out.buf[2 * i + 1] = HEX[(byte & 15) as usize];
    }
    out.len = (n * 2) as u8;
    Ok(out)
}

/// Decodes standard or URL-safe base64, padded or not, into `out`; returns the byte count.
fn decode_base64(input: &[u8], out: &mut [u8]) -> Result<usize, IdError> {
    fn val(c: u8) -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            _ => return None,
        } as u32)
    }
    let mut data = input;
    while let [rest @ .., b'='] = data {
        data = rest;
    }
    if input.len() - data.len() > 2 || data.is_empty() || data.len() % 4 == 1 {
        return Err(IdError::NotAnId);
    }
    if input.len() != data.len() && input.len() % 4 != 0 {
        return Err(IdError::NotAnId);
    }
    let n = data.len() / 4 * 3 + [0, 0, 1, 2][data.len() % 4];
    if n > out.len() {
        return Err(IdError::TooLong);
    }
    let mut acc: u32 = 0;
    let mut bits = 0;
    let mut w = 0;
    for &c in data {
        acc = (acc << 6) | val(c).ok_or(IdError::NotAnId)?;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out[w] = (acc >> bits) as u8;
            w += 1;
            acc &= (1 << bits) - 1;
        }
    }
    Ok(w)
}

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

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
pub fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = m as i64;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146097 + doe - 719468
}

/// Inverse of [`days_from_civil`].
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Parses an RFC 3339 timestamp (any number of fractional digits, `Z` or an offset) into
/// Unix seconds. Only what routing needs: the hour, so fractions are read and dropped.
pub fn parse_rfc3339_seconds(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() < 20 {
        return None;
    }
    let digits = |r: std::ops::Range<usize>| -> Option<i64> {
        let mut v: i64 = 0;
        for &c in b.get(r)? {
            if !c.is_ascii_digit() {
                return None;
            }
            v = v * 10 + (c - b'0') as i64;
        }
        Some(v)
    };
    if b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let (y, mo, d) = (digits(0..4)?, digits(5..7)?, digits(8..10)?);
    let (h, mi, sec) = (digits(11..13)?, digits(14..16)?, digits(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    let mut i = 19;
    if b.get(i) == Some(&b'.') {
        i += 1;
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i == start {
            return None;
        }
    }
    let offset = match b.get(i)? {
        b'Z' | b'z' if i + 1 == b.len() => 0,
        sign @ (b'+' | b'-') if i + 6 == b.len() && b[i + 3] == b':' => {
            let (oh, om) = (digits(i + 1..i + 3)?, digits(i + 4..i + 6)?);
            if oh > 23 || om > 59 {
                return None;
            }
            let o = oh * 3600 + om * 60;
            if *sign == b'+' {
                o
            } else {
                -o
            }
        }
        _ => return None,
    };
    let days = days_from_civil(y, mo as u32, d as u32);
    Some(days * 86400 + h * 3600 + mi * 60 + sec - offset)
}

/// RFC 3339 UTC with seconds precision, for quarantine records and logs.
pub fn format_rfc3339(unix_seconds: i64) -> String {
    let days = unix_seconds.div_euclid(86400);
    let rem = unix_seconds.rem_euclid(86400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Which event stream of a node an event belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stream {
    /// `node_events/`: node events and events without a job.
    Node,
    /// `job_events/<job-hex>/`.
    Job(String),
    /// `export_events/<job-hex or "node">/`: Ray's file-based export events.
    Export(String),
}

/// The unit of spooling and uploading: one session, node, stream and hour.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Partition {
    /// Ray session name, a safe segment.
    pub session: String,
    /// Node id in lower-case hex (or the configured fallback), a safe segment.
    pub node: String,
    /// Node or job stream.
    pub stream: Stream,
    /// UTC hour of the events' own timestamps.
    pub hour: Hour,
}

impl Partition {
    /// Key of one segment of this partition relative to `P`, without compression suffix:
    /// `<session>/<node>/node_events/<node>-<YYYY-MM-DD-HH>-<n>.jsonl` or
    /// `<session>/<node>/job_events/<job>/<node>-<YYYY-MM-DD-HH>-<n>.jsonl`.
    pub fn segment_relative_key(&self, n: u64) -> String {
        let file = format!("{}-{}-{}.jsonl", self.node, self.hour.label(), n);
        match &self.stream {
            Stream::Node => format!("{}/{}/node_events/{}", self.session, self.node, file),
            Stream::Job(job) => {
                format!("{}/{}/job_events/{}/{}", self.session, self.node, job, file)
            }
            Stream::Export(group) => {
                format!(
                    "{}/{}/export_events/{}/{}",
                    self.session, self.node, group, file
                )
            }
        }
    }

    /// Inverse of [`Partition::segment_relative_key`], for segments found in the spool at start.
    pub fn parse_relative_key(rel: &str) -> Option<(Partition, u64)> {
        let parts: Vec<&str> = rel.split('/').collect();
        let (session, node, stream, file) = match parts.as_slice() {
            [s, n, "node_events", f] => (*s, *n, Stream::Node, *f),
            [s, n, "job_events", j, f] if is_safe_segment(j) => {
                (*s, *n, Stream::Job(j.to_string()), *f)
            }
            [s, n, "export_events", g, f] if is_safe_segment(g) => {
                (*s, *n, Stream::Export(g.to_string()), *f)
            }
            _ => return None,
        };
        if !is_safe_segment(session) || !is_safe_segment(node) {
            return None;
        }
        let stem = file
            .strip_prefix(node)?
            .strip_prefix('-')?
            .strip_suffix(".jsonl")?;
        let (hour, n) = stem.rsplit_once('-')?;
        let n: u64 = n.parse().ok()?;
        let hour = Hour::parse_label(hour)?;
        Some((
            Partition {
                session: session.to_string(),
                node: node.to_string(),
                stream,
                hour,
            },
            n,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(root: &str, owner: Owner) -> ClusterLayout {
        ClusterLayout {
            root: root.into(),
            namespace: "default".into(),
            cluster: "raycluster-historyserver".into(),
            owner,
        }
    }

    #[test]
    fn raycluster_keys_match_the_history_server() {
        let l = layout("", Owner::RayCluster);
        let s = "session_2026-08-08_01-45-50_123456_1";
        assert_eq!(
            l.session_marker_key(s),
            "cluster-metadata/raycluster/default_raycluster-historyserver/session_2026-08-08_01-45-50_123456_1"
        );
        assert_eq!(
            l.history_prefix(),
            "cluster-history/raycluster/default/raycluster-historyserver"
        );
        let node = "0f690c018f332312c5b989cb5e700a26dbae9b206feb5f1f086485ee";
        let p = Partition {
            session: s.into(),
            node: node.into(),
            stream: Stream::Job("03000000".into()),
            hour: Hour::from_unix_seconds(
                parse_rfc3339_seconds("2026-08-08T01:45:58.211147463Z").unwrap(),
            ),
        };
        assert_eq!(
            format!("{}/{}", l.history_prefix(), p.segment_relative_key(1786153558211147463)),
            "cluster-history/raycluster/default/raycluster-historyserver/session_2026-08-08_01-45-50_123456_1/\
             0f690c018f332312c5b989cb5e700a26dbae9b206feb5f1f086485ee/job_events/03000000/\
             0f690c018f332312c5b989cb5e700a26dbae9b206feb5f1f086485ee-2026-08-08-01-1786153558211147463.jsonl"
        );
        let n = Partition {
            stream: Stream::Node,
            ..p
        };
        assert_eq!(
            n.segment_relative_key(7),
            format!("{s}/{node}/node_events/{node}-2026-08-08-01-7.jsonl")
        );
    }

    #[test]
    fn owned_cluster_keys_and_root() {
        let l = ClusterLayout {
            root: "history".into(),
            namespace: "default".into(),
            cluster: "rayjob-historyserver-abcde".into(),
            owner: Owner::RayJob("rayjob-historyserver".into()),
        };
        assert_eq!(
            l.history_prefix(),
            "history/cluster-history/rayjob/default/rayjob-historyserver/rayjob-historyserver-abcde"
        );
        assert_eq!(
            l.session_marker_key("session_x"),
            "history/cluster-metadata/rayjob/default_rayjob-historyserver_rayjob-historyserver-abcde/session_x"
        );
        let s = ClusterLayout {
            owner: Owner::RayService("svc".into()),
            root: String::new(),
            ..l
        };
        assert_eq!(
            s.history_prefix(),
            "cluster-history/rayservice/default/svc/rayjob-historyserver-abcde"
        );
        assert_eq!(
            s.session_marker_key("session_y"),
            "cluster-metadata/rayservice/default_svc_rayjob-historyserver-abcde/session_y"
        );
        assert_eq!(
            s.quarantine_prefix(),
            "collector-quarantine/rayservice/default/svc/rayjob-historyserver-abcde"
        );
    }

    #[test]
    fn event_object_names_match_the_readers_pattern() {
        // -\d{4}-\d{2}-\d{2}-\d{2}(-\d+)?(\.jsonl)?(\.gz)?$
        let p = Partition {
            session: "s".into(),
            node: "ab".into(),
            stream: Stream::Node,
            hour: Hour::from_unix_seconds(0),
        };
        let k = p.segment_relative_key(123);
        assert!(k.ends_with("ab-1970-01-01-00-123.jsonl"), "{k}");
        assert_eq!(Partition::parse_relative_key(&k), Some((p, 123)));
        assert_eq!(
            Partition::parse_relative_key("s/ab/node_events/zz-1970-01-01-00-1.jsonl"),
            None
        );
        assert_eq!(
            Partition::parse_relative_key("../ab/node_events/ab-1970-01-01-00-1.jsonl"),
            None
        );
        assert_eq!(
            Partition::parse_relative_key("s/ab/job_events/../ab-1970-01-01-00-1.jsonl"),
            None
        );
    }

    #[test]
    fn ids_convert_like_kuberay() {
        assert_eq!(id_to_hex("AQAAAA==").unwrap().as_str(), "01000000");
        assert_eq!(id_to_hex("AQAAAA").unwrap().as_str(), "01000000");
        assert_eq!(
            id_to_hex("0yfRX1ex+VtcC+TFXjXcgesdpnEwM76+pEATrQ==")
                .unwrap()
                .as_str(),
            "d327d15f57b1f95b5c0be4c55e35dc81eb1da6713033bebea44013ad"
        );
        assert_eq!(
            id_to_hex("0yfRX1ex-VtcC-TFXjXcgesdpnEwM76-pEATrQ")
                .unwrap()
                .as_str(),
            "d327d15f57b1f95b5c0be4c55e35dc81eb1da6713033bebea44013ad"
        );
        assert_eq!(id_to_hex("ABCDEF01").unwrap().as_str(), "abcdef01");
        assert_eq!(id_to_hex("../etc").unwrap_err(), IdError::NotAnId);
        assert_eq!(id_to_hex("a b").unwrap_err(), IdError::NotAnId);
        assert_eq!(id_to_hex("A").unwrap_err(), IdError::NotAnId);
        assert_eq!(id_to_hex("AQ===").unwrap_err(), IdError::NotAnId);
        assert_eq!(id_to_hex(&"QUFB".repeat(40)).unwrap_err(), IdError::TooLong);
    }

    #[test]
    fn safe_segments() {
        assert!(is_safe_segment("session_2026-11-22_02-06-54_202993_22498"));
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "a\\b",
            "a b",
            "é",
            "a\0",
            &"x".repeat(129),
        ] {
            assert!(!is_safe_segment(bad), "{bad:?}");
        }
        assert!(is_dns1123_subdomain("raycluster-historyserver"));
        assert!(is_dns1123_subdomain("a.b-c"));
        assert!(!is_dns1123_subdomain("Upper"));
        assert!(!is_dns1123_subdomain("-a"));
        assert!(!is_dns1123_subdomain("a_b"));
    }

    #[test]
    fn timestamps_and_hours() {
        let t = parse_rfc3339_seconds("2026-11-22T02:06:40.945470430Z").unwrap();
        assert_eq!(Hour::from_unix_seconds(t).label(), "2026-11-22-02");
        assert_eq!(parse_rfc3339_seconds("2026-11-22T02:06:40Z"), Some(t));
        assert_eq!(
            parse_rfc3339_seconds("2026-11-22T04:06:40.1+02:00"),
            Some(t)
        );
        assert_eq!(parse_rfc3339_seconds("2026-11-22T00:06:40-02:00"), Some(t));
        assert_eq!(parse_rfc3339_seconds("1970-01-01T00:00:00Z"), Some(0));
        for bad in [
            "",
            "2026-11-22",
            "2026-13-22T02:06:40Z",
            "2026-11-22T02:06:40",
            "2026-11-22T02:06:40.Z",
            "x026-11-22T02:06:40Z",
            "2026-11-22T02:06:40Zjunk",
        ] {
            assert_eq!(parse_rfc3339_seconds(bad), None, "{bad}");
        }
        assert_eq!(
            Hour::parse_label("2026-11-22-02"),
            Some(Hour::from_unix_seconds(t))
        );
        assert_eq!(Hour::from_unix_seconds(-1).label(), "1969-12-31-23");
        assert_eq!(format_rfc3339(t), "2026-11-22T02:06:40Z");
        for days in [-800_000i64, -1, 0, 1, 19_000, 20_000, 2_000_000] {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
    }
}
