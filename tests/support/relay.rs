//! A TCP relay on loopback that can be cut and restored, for storage-outage tests: the
//! storage server keeps its state while the path to it goes away (connection refused,
//! open connections reset), like a network or endpoint outage.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

pub struct TcpRelay {
    pub port: u16,
    target: String,
    up: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
    acceptor: Option<thread::JoinHandle<()>>,
}

impl TcpRelay {
    /// Relays 127.0.0.1:<free port> to `target` (host:port).
    pub fn start(target: &str) -> TcpRelay {
        let port = super::services::free_port();
        let mut r = TcpRelay {
            port,
            target: target.to_string(),
            up: Arc::new(AtomicBool::new(false)),
            conns: Arc::new(Mutex::new(Vec::new())),
            acceptor: None,
        };
        r.restore();
        r
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
        for c in self.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }

    /// Listens again on the same port.
    pub fn restore(&mut self) {
        assert!(self.acceptor.is_none());
        let listener = {
            let mut tries = 0;
            loop {
                match TcpListener::bind(("127.0.0.1", self.port)) {
                    Ok(l) => break l,
                    Err(e) if tries < 100 => {
                        tries += 1;
                        let _ = e;
                        thread::sleep(Duration::from_millis(50));
                    }
                    Err(e) => panic!("relay cannot rebind port {}: {e}", self.port),
                }
            }
        };
        listener.set_nonblocking(true).unwrap();
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
                        let mut list = conns.lock().unwrap();
                        list.push(client.try_clone().unwrap());
                        list.push(server.try_clone().unwrap());
                        drop(list);
                        pipe(client.try_clone().unwrap(), server.try_clone().unwrap());
                        pipe(server, client);
                    }
                    Err(_) => thread::sleep(Duration::from_millis(5)),
                }
            }
        }));
    }
}

fn pipe(mut from: TcpStream, mut to: TcpStream) {
    thread::spawn(move || {
        let mut buf = [0u8; 64 * 1024];
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
