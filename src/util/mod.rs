//! Helpers shared by more than one path: time formats, sizes and durations, durable small
//! files, directory watching, giving memory back, a bandwidth cap, a window of recent hashes.

pub mod dedup;
pub mod fs;
pub mod memory;
pub mod pace;
pub mod time;
pub mod units;
pub mod watch;
