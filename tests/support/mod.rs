pub mod collector;
pub mod relay;
pub mod services;
