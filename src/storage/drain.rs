//! What the kernel says of the log lane's connections: how many bytes of each the peer
//! acknowledged (Linux's `TCP_INFO`, `tcpi_bytes_acked`), so a body the HTTP client handed
//! over whole, still draining from the socket's send buffer, is seen moving (review r42i D2).
//!
//! The send buffer takes the last few MiB of a body at once: to the HTTP client (and to
//! `storage::counted`, which counts what it takes) the body is done, and over a slow link the
//! bytes leave the machine for tens of seconds more. [`Conns`] holds the connections of one
//! client, each found by its addresses among the process's sockets when it was made (the
//! client does not give out its sockets); [`Conns::acked_more`] says whether the peer
//! acknowledged bytes of any of them since the last look. A connection that is gone, or a
//! system that cannot say (not Linux, a kernel before 4.1), is forgotten: nothing is seen
//! moving, and the flush's rule for a body handed over whole applies alone.
//!
//! The sockets are read by number, never closed nor written: a number reused by another
//! file between two looks is told apart by its addresses, checked at every look.
//!
//! A count is credited to whoever looks, so the owner of [`Conns`] (a slot of
//! `storage::counted`) must hand it over only when its connections carry nothing of the
//! request before: [`Conns::baseline`] makes the next look start from now, and
//! [`Conns::unacked`] says whether a connection still holds bytes its peer has not
//! acknowledged (review r42k D1).
//!
//! [`Conns::abort`] ends the connections of a client that is not used again (review r39q
//! D2): a store that answered a request before it read the body, and then neither reads nor
//! closes, leaves the HTTP client writing that body for ever, its socket and the body's
//! memory held, the kernel's send buffer full. The abort sets `SO_LINGER` to 0 and shuts the
//! socket down both ways: the client's next write fails, it drops the connection, and the
//! close resets it, so the kernel frees its send queue at once. It is the one thing done to
//! a socket that is not a read, and it is done only to a socket whose addresses are checked
//! just before, of a connection its client is blocked on or keeps idle (so the number is not
//! freed under it, but if the peer closes it in the same microseconds and the number is
//! reused by a new socket between the check and the shutdown).

use std::net::SocketAddr;
use std::sync::Mutex;

/// The connections of one HTTP client, each with the bytes its peer acknowledged at the
/// last look.
#[derive(Debug, Default)]
pub struct Conns {
    inner: Mutex<Vec<Conn>>,
}

#[derive(Debug)]
struct Conn {
    local: SocketAddr,
    peer: SocketAddr,
    fd: i32,
    acked: u64,
}

impl Conns {
    /// A connection the client made from `local` to `peer`: found among the process's
    /// sockets, or not kept (the kernel cannot say of it).
    pub fn add(&self, local: SocketAddr, peer: SocketAddr) {
        let Some(fd) = sys::find(local, peer) else {
            return;
        };
        let Some(acked) = sys::acked(fd, local, peer) else {
            return;
        };
        let mut conns = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        conns.retain(|c| c.fd != fd);
        conns.push(Conn {
            local,
            peer,
            fd,
            acked,
        });
    }

    /// Whether the peer of any of the connections acknowledged bytes since the last look;
    /// the connections that are gone are forgotten.
    pub fn acked_more(&self) -> bool {
        let mut conns = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let mut moved = false;
        conns.retain_mut(|c| match sys::acked(c.fd, c.local, c.peer) {
            Some(n) => {
                moved |= n > c.acked;
                c.acked = n;
                true
            }
            None => false,
        });
        moved
    }

    /// Every connection's count read again, so the next look credits only what the peer
    /// acknowledges from now on; the connections that are gone are forgotten.
    pub fn baseline(&self) {
        let mut conns = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        conns.retain_mut(|c| match sys::acked(c.fd, c.local, c.peer) {
            Some(n) => {
                c.acked = n;
                true
            }
            None => false,
        });
    }

    /// Whether a connection holds bytes its peer has not acknowledged yet (a body still
    /// draining from the socket's send buffer, or being written). A connection the kernel
    /// cannot say of counts as holding some.
    pub fn unacked(&self) -> bool {
        let conns = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        conns
            .iter()
            .any(|c| sys::unacked(c.fd, c.local, c.peer).is_none_or(|n| n > 0))
    }

    /// Every connection still open shut down both ways, reset when its client closes it (see
    /// the module doc); the client is not to use them again.
    pub fn abort(&self) {
        let conns = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        for c in conns.iter() {
            sys::abort(c.fd, c.local, c.peer);
        }
    }

    /// Connections known.
    pub fn len(&self) -> usize {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// No connection known.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(target_os = "linux")]
mod sys {
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};

    /// The socket of the process whose addresses are `local` and `peer`.
    pub fn find(local: SocketAddr, peer: SocketAddr) -> Option<i32> {
        let dir = std::fs::read_dir("/proc/self/fd").ok()?;
        for e in dir.flatten() {
            let Some(fd) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
                continue;
            };
            let socket = std::fs::read_link(e.path())
                .is_ok_and(|t| t.as_os_str().as_encoded_bytes().starts_with(b"socket:"));
            if socket && is(fd, local, peer) {
                return Some(fd);
            }
        }
        None
    }

    /// Bytes the peer of socket `fd` acknowledged, if `fd` is still the socket from `local`
    /// to `peer` and the kernel says.
    pub fn acked(fd: i32, local: SocketAddr, peer: SocketAddr) -> Option<u64> {
        if !is(fd, local, peer) {
            return None;
        }
        // SAFETY: `tcp_info` is plain data; getsockopt writes at most `len` bytes into it.
        let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        // SAFETY: `info` and `len` are valid for writes of the sizes given.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                libc::IPPROTO_TCP,
                libc::TCP_INFO,
                (&mut info as *mut libc::tcp_info).cast(),
                &mut len,
            )
        };
        let needed = std::mem::offset_of!(libc::tcp_info, tcpi_bytes_acked) + 8;
        (rc == 0 && len as usize >= needed).then_some(info.tcpi_bytes_acked)
    }

    /// Bytes in the send queue of socket `fd` its peer has not acknowledged (`SIOCOUTQ`),
    /// if the kernel says; 0 when `fd` is no longer the socket from `local` to `peer`: the
    /// connection was closed, so nothing more is written on it and no request can be credited
    /// with it (review r42p D2: counted as holding bytes, every request to a store that
    /// closes its connections retired its slot and built a new client).
    pub fn unacked(fd: i32, local: SocketAddr, peer: SocketAddr) -> Option<u64> {
        if !is(fd, local, peer) {
            return Some(0);
        }
        let mut n: libc::c_int = 0;
        // SAFETY: TIOCOUTQ (SIOCOUTQ on a TCP socket) writes one int into `n`.
        let rc = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut n as *mut libc::c_int) };
        (rc == 0).then(|| u64::try_from(n).unwrap_or(0))
    }

    /// Socket `fd`, if it is still the one from `local` to `peer`: `SO_LINGER` 0 (its close
    /// resets it and drops what its send queue holds), then shut down both ways (its writer's
    /// next write fails, and a reader sees the end).
    pub fn abort(fd: i32, local: SocketAddr, peer: SocketAddr) {
        if !is(fd, local, peer) {
            return;
        }
        let linger = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        // SAFETY: a pointer to a `linger` of the size given; a socket option only.
        unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&linger as *const libc::linger).cast(),
                std::mem::size_of::<libc::linger>() as libc::socklen_t,
            );
        }
        // SAFETY: shutdown takes a descriptor and a flag; the descriptor is not closed.
        unsafe {
            libc::shutdown(fd, libc::SHUT_RDWR);
        }
    }

    fn is(fd: i32, local: SocketAddr, peer: SocketAddr) -> bool {
        same(name(fd, libc::getsockname), local) && same(name(fd, libc::getpeername), peer)
    }

    fn same(a: Option<SocketAddr>, b: SocketAddr) -> bool {
        a.is_some_and(|a| a.ip() == b.ip() && a.port() == b.port())
    }

    type NameFn =
        unsafe extern "C" fn(libc::c_int, *mut libc::sockaddr, *mut libc::socklen_t) -> libc::c_int;

    fn name(fd: i32, f: NameFn) -> Option<SocketAddr> {
        // SAFETY: `sockaddr_storage` is plain data, large enough for any address.
        let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        let at = (&mut ss as *mut libc::sockaddr_storage).cast();
        // SAFETY: `ss` and `len` are valid for writes of the sizes given.
        if unsafe { f(fd, at, &mut len) } != 0 {
            return None;
        }
        match ss.ss_family as libc::c_int {
            libc::AF_INET => {
                // SAFETY: the kernel wrote a `sockaddr_in` (family AF_INET).
                let a: libc::sockaddr_in =
                    unsafe { std::ptr::read((&ss as *const libc::sockaddr_storage).cast()) };
                let ip = Ipv4Addr::from(a.sin_addr.s_addr.to_ne_bytes());
                Some(SocketAddr::from((ip, u16::from_be(a.sin_port))))
            }
            libc::AF_INET6 => {
                // SAFETY: the kernel wrote a `sockaddr_in6` (family AF_INET6).
                let a: libc::sockaddr_in6 =
                    unsafe { std::ptr::read((&ss as *const libc::sockaddr_storage).cast()) };
                let ip = Ipv6Addr::from(a.sin6_addr.s6_addr);
                Some(SocketAddr::from((ip, u16::from_be(a.sin6_port))))
            }
            _ => None,
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod sys {
    use std::net::SocketAddr;

    pub fn find(_local: SocketAddr, _peer: SocketAddr) -> Option<i32> {
        None
    }

    pub fn acked(_fd: i32, _local: SocketAddr, _peer: SocketAddr) -> Option<u64> {
        None
    }

    pub fn unacked(_fd: i32, _local: SocketAddr, _peer: SocketAddr) -> Option<u64> {
        None
    }

    pub fn abort(_fd: i32, _local: SocketAddr, _peer: SocketAddr) {}
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// A connection's bytes are seen acknowledged as the peer reads them, and a closed one
    /// is forgotten.
    #[test]
    fn a_connection_is_found_and_its_acked_bytes_seen() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut server, _) = listener.accept().unwrap();
        let conns = Conns::default();
        conns.add(client.local_addr().unwrap(), client.peer_addr().unwrap());
        assert_eq!(conns.len(), 1);
        assert!(!conns.acked_more());
        client.write_all(&[1u8; 1000]).unwrap();
        let mut buf = [0u8; 1000];
        server.read_exact(&mut buf).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !conns.acked_more() {
            assert!(std::time::Instant::now() < deadline, "no ack seen");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        drop(client);
        // A closed connection holds nothing of ours (review r42p D2).
        assert_eq!(conns.len(), 1);
        assert!(!conns.unacked());
        assert!(!conns.acked_more());
        assert!(conns.is_empty());
    }

    /// Review r42k D1: bytes the peer has not taken are seen held; once it took them all,
    /// a baseline leaves nothing to credit to the next look.
    #[test]
    fn bytes_held_are_seen_and_a_baseline_credits_none_of_the_past() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut server, _) = listener.accept().unwrap();
        let conns = Conns::default();
        conns.add(client.local_addr().unwrap(), client.peer_addr().unwrap());
        assert!(!conns.unacked());
        // Writes until the peer's window and the send buffer are full.
        client.set_nonblocking(true).unwrap();
        let mut sent = 0usize;
        loop {
            match client.write(&[3u8; 64 << 10]) {
                Ok(n) => sent += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("{e}"),
            }
        }
        assert!(conns.unacked());
        let mut got = 0usize;
        let mut buf = vec![0u8; 64 << 10];
        while got < sent {
            got += server.read(&mut buf).unwrap();
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while conns.unacked() {
            assert!(std::time::Instant::now() < deadline, "bytes never acked");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        conns.baseline();
        assert!(!conns.acked_more());
        assert_eq!(conns.len(), 1);
    }

    /// Review r39q D2: a connection whose peer reads nothing, its send buffer full, is
    /// ended by an abort: the writer's next write fails, and its close resets the connection,
    /// so what its send queue held never reaches the peer and nothing is held.
    #[test]
    fn an_aborted_connection_stops_writing_and_its_close_drops_its_bytes() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut server, _) = listener.accept().unwrap();
        let conns = Conns::default();
        conns.add(client.local_addr().unwrap(), client.peer_addr().unwrap());
        client.set_nonblocking(true).unwrap();
        let mut sent = 0usize;
        loop {
            match client.write(&[5u8; 64 << 10]) {
                Ok(n) => sent += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("{e}"),
            }
        }
        assert!(conns.unacked());
        conns.abort();
        let e = client.write(&[5u8; 1024]).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe);
        drop(client);
        assert!(!conns.unacked());
        server
            .set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        let mut got = 0usize;
        let mut buf = vec![0u8; 64 << 10];
        let end = loop {
            match server.read(&mut buf) {
                Ok(0) => break None,
                Ok(n) => got += n,
                Err(e) => break Some(e.kind()),
            }
        };
        assert_eq!(end, Some(std::io::ErrorKind::ConnectionReset));
        assert!(got < sent, "the peer got all {sent} bytes: not reset");
    }
}
