//! Podman: the Docker runtime (`runtime::docker`) on Podman's Docker-compatible API. What
//! differs lives in the Docker runtime itself, chosen by the engine it finds (`Engine::Podman`:
//! GPUs as CDI devices, one isolated network per run); this folder holds how the worker gets
//! there with `--bundle-runtime podman`.

pub mod args;
