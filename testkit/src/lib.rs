//! The harness of the end-to-end tests (a dev-dependency only): the peers started by the scripts
//! in `tests/peers/`.

pub mod peers;
