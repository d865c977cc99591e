//! The event path: Ray → HTTP → parse → route → dedup → spool → upload.
pub mod camel;
pub mod dedup;
pub mod export_tailer;
pub mod http;
pub mod object;
pub mod parse;
pub mod publish;
pub mod quarantine;
pub mod route;
pub mod spool;
pub mod upload;
