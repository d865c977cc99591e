//! Ray ids (node, job) as they appear in keys: lower-case hex.
//!
//! Ray sends ids base64-encoded in its events; KubeRay's history server converts them to hex
//! and looks for directories of that name, so the conversion is part of the contract.

use std::fmt;

use super::names::MAX_SEGMENT_LEN;

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
    if !b.is_empty() && b.len().is_multiple_of(2) && b.iter().all(|c| c.is_ascii_hexdigit()) {
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
    if input.len() != data.len() && !input.len().is_multiple_of(4) {
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

/// A Ray id as the dashboard lists it (job, node): already hex, and short enough to be a key
/// segment. Ids from an answer of a process we do not control go into URLs and keys only
/// after this check.
pub fn is_hex_id(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_SEGMENT_LEN && s.bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(is_hex_id("03000000") && is_hex_id("ABCdef"));
        assert!(!is_hex_id("") && !is_hex_id("0x1") && !is_hex_id(&"a".repeat(129)));
    }
}
