//! The CodaLab worker protocol: wire types and the REST client shared by `cl-worker` and
//! `cl-worker-manager`.

pub mod auth;
pub mod client;
pub mod net;
pub mod types;

pub use auth::{Credentials, CredentialsError};
pub use client::{ClientConfig, Error, RestClient};
pub use types::*;
