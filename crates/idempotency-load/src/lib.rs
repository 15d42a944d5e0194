#![doc = include_str!("../README.md")]

pub mod chaos;
pub mod client;
mod error;
pub mod keys;
pub mod load;
pub mod report;
pub mod tally;

pub use error::Error;
