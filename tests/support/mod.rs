pub mod collector;
pub mod ray;
pub mod relay;
pub mod services;
