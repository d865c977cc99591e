//! Helpers shared by more than one path: time formats, sizes and durations, durable small
//! files, directory watching, giving memory back.

pub mod fs;
pub mod memory;
pub mod time;
pub mod units;
pub mod watch;
