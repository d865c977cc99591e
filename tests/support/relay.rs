//! The loopback TCP relay of the chaos suite, for storage-outage tests (one source file,
//! shared with `rhc-chaos`).
#![allow(dead_code)]

#[path = "../../src/bin/common/tcp_relay.rs"]
mod tcp_relay;

#[allow(unused_imports)]
pub use tcp_relay::TcpRelay;
