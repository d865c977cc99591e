//! Which Ray session is active on this node, and which node this is.
pub mod node_id;
pub mod session;
