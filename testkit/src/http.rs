//! The one blocking HTTP/1.1 client of the tests and tools: one-shot requests
//! ([`try_http_request`], `Connection: close`), a keep-alive connection ([`Conn`]) for load,
//! and [`read_response`] for anything that reads answers off a stream by hand. Responses with
//! `Content-Length`, chunked bodies, interim 1xx answers and HEAD are read correctly; every
//! connect, read and write has a timeout. Only `http://`: everything we talk to is on
//! loopback.

use std::io::{self, BufRead, BufReader, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// Read/write timeout of [`http_request`] and [`try_http_request`].
pub const HTTP_TIMEOUT: Duration = Duration::from_secs(10);

/// A parsed HTTP response; header names are lower-cased.
#[derive(Debug, Clone)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl HttpResponse {
    /// True when the server said it closes the connection after this answer.
    pub fn closes(&self) -> bool {
        self.header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"))
    }

    /// The first header named `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// One HTTP/1.1 request over a fresh connection (`Connection: close`), with
/// [`HTTP_TIMEOUT`] for connect, each read and each write. Only `http://` URLs.
/// Returns (status, body); panics on any I/O or protocol error.
pub fn http_request(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, Vec<u8>) {
    let resp = try_http_request(method, url, headers, body)
        .unwrap_or_else(|e| panic!("{method} {url} failed: {e}"));
    (resp.status, resp.body)
}

/// Like [`http_request`] but returns errors and the response headers.
pub fn try_http_request(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> io::Result<HttpResponse> {
    try_http_request_within(method, url, headers, body, HTTP_TIMEOUT)
}

/// Like [`try_http_request`], with `timeout` for the connect, each read and each write.
pub fn try_http_request_within(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    timeout: Duration,
) -> io::Result<HttpResponse> {
    let invalid = |msg: String| io::Error::new(io::ErrorKind::InvalidInput, msg);
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| invalid(format!("only http:// URLs are supported: {url}")))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let host_port = if authority.contains(':') {
        authority.to_string()
    } else {
        format!("{authority}:80")
    };
    let addr = host_port
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| invalid(format!("cannot resolve {authority}")))?;

    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;

    let has = |name: &str| headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(name));
    let mut head = format!("{method} {path} HTTP/1.1\r\n");
    if !has("host") {
        head.push_str(&format!("Host: {authority}\r\n"));
    }
    head.push_str("Connection: close\r\n");
    if !has("content-length") && !has("transfer-encoding") {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    for (k, v) in headers {
        if k.eq_ignore_ascii_case("connection") {
            continue;
        }
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    stream.flush()?;

    read_response(&mut BufReader::new(stream), method)
}

/// Reads one HTTP/1.1 response (after any interim 1xx) from `reader`; `method` is the
/// request's, since a HEAD answer has no body.
pub fn read_response(reader: &mut impl BufRead, method: &str) -> io::Result<HttpResponse> {
    let invalid = |msg: String| io::Error::new(io::ErrorKind::InvalidInput, msg);
    let (status, resp_headers) = loop {
        let (status, hs) = read_head(reader)?;
        // Skip interim responses (100 Continue etc.), but not 101.
        if (100..200).contains(&status) && status != 101 {
            continue;
        }
        break (status, hs);
    };
    let header = |name: &str| {
        resp_headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let mut body = Vec::new();
    let no_body = method.eq_ignore_ascii_case("HEAD") || status == 204 || status == 304;
    if !no_body {
        if header("transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked")) {
            read_chunked(reader, &mut body)?;
        } else if let Some(len) = header("content-length") {
            let len: usize = len
                .trim()
                .parse()
                .map_err(|_| invalid(format!("bad Content-Length {len:?}")))?;
            body.resize(len, 0);
            reader.read_exact(&mut body)?;
        } else {
            reader.read_to_end(&mut body)?;
        }
    }
    Ok(HttpResponse {
        status,
        headers: resp_headers,
        body,
    })
}

fn read_line(reader: &mut impl BufRead) -> io::Result<String> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed in the middle of an HTTP response",
        ));
    }
    Ok(line.trim_end_matches(['\r', '\n']).to_string())
}

fn read_head(reader: &mut impl BufRead) -> io::Result<(u16, Vec<(String, String)>)> {
    let status_line = read_line(reader)?;
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .filter(|_| status_line.starts_with("HTTP/"))
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("bad HTTP status line {status_line:?}"),
            )
        })?;
    Ok((status, read_headers(reader)?))
}

/// Header lines up to the empty line; names lower-cased.
fn read_headers(reader: &mut impl BufRead) -> io::Result<Vec<(String, String)>> {
    let mut headers = Vec::new();
    loop {
        let line = read_line(reader)?;
        if line.is_empty() {
            return Ok(headers);
        }
        if let Some((k, v)) = line.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
}

fn read_chunked(reader: &mut impl BufRead, body: &mut Vec<u8>) -> io::Result<()> {
    loop {
        let line = read_line(reader)?;
        let size_hex = line.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_hex, 16).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("bad chunk size {line:?}"),
            )
        })?;
        if size == 0 {
            // Trailers, then an empty line.
            while !read_line(reader)?.is_empty() {}
            return Ok(());
        }
        let start = body.len();
        body.resize(start + size, 0);
        reader.read_exact(&mut body[start..])?;
        let crlf = read_line(reader)?;
        if !crlf.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "missing CRLF after chunk",
            ));
        }
    }
}

/// One keep-alive HTTP/1.1 connection to `127.0.0.1:<port>` (or any `host:port`), for
/// clients that send many requests: the load generator and the chaos suite.
pub struct Conn {
    reader: BufReader<TcpStream>,
    authority: String,
    head: String,
}

impl Conn {
    /// Whether the server has closed the connection (an end of stream or a reset is waiting
    /// to be read), as pooled HTTP clients (aiohttp, Ray's) learn before they reuse one.
    pub fn closed_by_peer(&mut self) -> bool {
        if !self.reader.buffer().is_empty() {
            return false;
        }
        let s = self.reader.get_ref();
        if s.set_nonblocking(true).is_err() {
            return true;
        }
        let mut b = [0u8; 1];
        let closed = match s.peek(&mut b) {
            Ok(n) => n == 0,
            Err(e) => e.kind() != io::ErrorKind::WouldBlock,
        };
        let _ = s.set_nonblocking(false);
        closed
    }

    /// Connects (within 5 s) with `timeout` for every read and write; Nagle off.
    pub fn open(authority: &str, timeout: Duration) -> io::Result<Conn> {
        let addr = authority.to_socket_addrs()?.next().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("cannot resolve {authority}"),
            )
        })?;
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(timeout))?;
        s.set_write_timeout(Some(timeout))?;
        Ok(Conn {
            reader: BufReader::with_capacity(16 * 1024, s),
            authority: authority.to_string(),
            head: String::with_capacity(256),
        })
    }

    /// Sends one request and reads its answer. When the answer says `Connection: close`
    /// ([`HttpResponse::closes`]), the caller opens a new connection for the next one.
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> io::Result<HttpResponse> {
        use std::fmt::Write as _;
        self.head.clear();
        let _ = write!(
            self.head,
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Length: {}\r\n",
            self.authority,
            body.len()
        );
        for (k, v) in headers {
            let _ = write!(self.head, "{k}: {v}\r\n");
        }
        self.head.push_str("\r\n");
        let s = self.reader.get_mut();
        s.write_all(self.head.as_bytes())?;
        s.write_all(body)?;
        read_response(&mut self.reader, method)
    }
}
