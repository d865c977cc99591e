//! A TCP relay on loopback that can be cut and restored, for storage-outage scenarios: the
//! storage server keeps its state while the path to it goes away (connection refused, open
//! connections reset), like a network or endpoint outage.
//! Used by the chaos suite and the integration tests.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// 127.0.0.1:<port> → `target`; `cut` refuses new connections and resets open ones,
/// `restore` listens again on the same port.
pub struct TcpRelay {
    pub port: u16,
    target: String,
    up: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
    acceptor: Option<JoinHandle<()>>,
}

impl TcpRelay {
    /// Relays a free loopback port to `target` (host:port).
    pub fn start(target: &str) -> Result<TcpRelay, String> {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .map_err(|e| format!("relay cannot find a free port: {e}"))?;
        let mut r = TcpRelay {
            port,
            target: target.to_string(),
            up: Arc::new(AtomicBool::new(false)),
            conns: Arc::new(Mutex::new(Vec::new())),
            acceptor: None,
        };
        r.restore()?;
        Ok(r)
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Closes the port and resets every open connection.
    pub fn cut(&mut self) {
        self.up.store(false, Ordering::SeqCst);
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
        let mut list = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        for c in list.drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }

    /// Listens again on the same port (a no-op if it is listening).
    pub fn restore(&mut self) -> Result<(), String> {
        if self.acceptor.is_some() {
            return Ok(());
        }
        // The port may linger for a moment after `cut`.
        let deadline = Instant::now() + Duration::from_secs(10);
        let listener = loop {
            match TcpListener::bind(("127.0.0.1", self.port)) {
                Ok(l) => break l,
                Err(e) if Instant::now() > deadline => {
                    return Err(format!("relay cannot bind port {}: {e}", self.port))
                }
                Err(_) => thread::sleep(Duration::from_millis(50)),
            }
        };
        listener.set_nonblocking(true).map_err(|e| e.to_string())?;
        self.up.store(true, Ordering::SeqCst);
        let (up, conns, target) = (self.up.clone(), self.conns.clone(), self.target.clone());
        self.acceptor = Some(thread::spawn(move || {
            while up.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let _ = client.set_nonblocking(false);
                        let Ok(server) = TcpStream::connect(&target) else {
                            continue;
                        };
                        let _ = client.set_nodelay(true);
                        let _ = server.set_nodelay(true);
                        let (Ok(c2), Ok(s2), Ok(c3), Ok(s3)) = (
                            client.try_clone(),
                            server.try_clone(),
                            client.try_clone(),
                            server.try_clone(),
                        ) else {
                            continue;
                        };
                        let mut list = conns.lock().unwrap_or_else(|p| p.into_inner());
                        // Forget the closed ones, so a long run does not keep every fd.
                        list.retain(|s| s.peer_addr().is_ok());
                        list.push(c2);
                        list.push(s2);
                        drop(list);
                        pipe(client, server);
                        pipe(s3, c3);
                    }
                    Err(_) => thread::sleep(Duration::from_millis(5)),
                }
            }
        }));
        Ok(())
    }
}

fn pipe(mut from: TcpStream, mut to: TcpStream) {
    thread::spawn(move || {
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}

impl Drop for TcpRelay {
    fn drop(&mut self) {
        self.cut();
    }
}
