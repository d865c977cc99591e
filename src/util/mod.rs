//! Helpers shared by more than one path.
pub mod units;
