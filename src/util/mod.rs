//! Helpers shared by more than one path.
pub mod time;
pub mod units;
pub mod watch;
