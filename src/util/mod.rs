//! Helpers shared by more than one path.
