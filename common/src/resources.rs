//! CPUs, GPUs and memory: the one type the manager's policy, the backends and the worker use for
//! a worker's size, a bundle's request, a machine's or a node's free capacity, and a named worker
//! shape.

use serde::{Deserialize, Serialize};

/// CPUs, GPUs and memory (bytes): of a worker, a bundle request, or what a place can still give.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Resources {
    pub cpus: u32,
    pub gpus: u32,
    pub memory_bytes: u64,
}

impl Resources {
    pub fn new(cpus: u32, gpus: u32, memory_bytes: u64) -> Self {
        Resources {
            cpus,
            gpus,
            memory_bytes,
        }
    }

    /// Memory given in MiB, as the flags and the config files give it (saturating).
    pub fn from_mb(cpus: u32, gpus: u32, memory_mb: u64) -> Self {
        Resources::new(cpus, gpus, memory_mb.saturating_mul(1 << 20))
    }

    /// True when `need` fits in `self` on every dimension.
    pub fn fits(&self, need: &Resources) -> bool {
        need.cpus <= self.cpus && need.gpus <= self.gpus && need.memory_bytes <= self.memory_bytes
    }

    /// Takes `need` away (it must fit).
    pub fn subtract(&mut self, need: &Resources) {
        self.cpus -= need.cpus;
        self.gpus -= need.gpus;
        self.memory_bytes -= need.memory_bytes;
    }

    /// Adds `other`, saturating.
    pub fn add(&mut self, other: &Resources) {
        self.cpus = self.cpus.saturating_add(other.cpus);
        self.gpus = self.gpus.saturating_add(other.gpus);
        self.memory_bytes = self.memory_bytes.saturating_add(other.memory_bytes);
    }

    /// Each dimension capped at `limit`'s.
    pub fn min_each(&self, limit: &Resources) -> Resources {
        Resources::new(
            self.cpus.min(limit.cpus),
            self.gpus.min(limit.gpus),
            self.memory_bytes.min(limit.memory_bytes),
        )
    }

    /// The order used for "smallest shape" and for first-fit-decreasing: gpus, then cpus, then
    /// memory.
    pub fn size_key(&self) -> (u32, u32, u64) {
        (self.gpus, self.cpus, self.memory_bytes)
    }
}

/// A worker shape: what one launched worker job provides, by name. Serialized flat, as
/// `{"name", "cpus", "gpus", "memory_bytes"}` (the `shapes` of `/status`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "ShapeWire", into = "ShapeWire")]
pub struct Shape {
    pub name: String,
    /// What one worker of this shape provides.
    pub resources: Resources,
}

/// [`Shape`] as it is serialized: its resources beside its name.
#[derive(Serialize, Deserialize)]
struct ShapeWire {
    name: String,
    cpus: u32,
    gpus: u32,
    memory_bytes: u64,
}

impl From<ShapeWire> for Shape {
    fn from(w: ShapeWire) -> Self {
        Shape::new(w.name, w.cpus, w.gpus, w.memory_bytes)
    }
}

impl From<Shape> for ShapeWire {
    fn from(s: Shape) -> Self {
        ShapeWire {
            name: s.name,
            cpus: s.resources.cpus,
            gpus: s.resources.gpus,
            memory_bytes: s.resources.memory_bytes,
        }
    }
}

impl Shape {
    pub fn new(name: impl Into<String>, cpus: u32, gpus: u32, memory_bytes: u64) -> Self {
        Shape {
            name: name.into(),
            resources: Resources::new(cpus, gpus, memory_bytes),
        }
    }

    /// The default shape from the backend flags `--cpus`, `--gpus` and `--memory-mb` (MiB, as
    /// Python's `parse_size(f"{memory_mb}m")`).
    pub fn from_flags(cpus: u32, gpus: u32, memory_mb: u64) -> Self {
        Shape {
            name: "default".into(),
            resources: Resources::from_mb(cpus, gpus, memory_mb),
        }
    }

    /// Smallest first (see [`Resources::size_key`]), then by name.
    pub fn order_key(&self) -> ((u32, u32, u64), &str) {
        (self.resources.size_key(), self.name.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fits_adds_subtracts_and_caps() {
        let mut a = Resources::new(4, 1, 8 << 30);
        let b = Resources::new(2, 1, 2 << 30);
        assert!(a.fits(&b) && !b.fits(&a));
        a.subtract(&b);
        assert_eq!(a, Resources::new(2, 0, 6 << 30));
        a.add(&Resources::new(u32::MAX, 0, 0));
        assert_eq!(a.cpus, u32::MAX);
        assert_eq!(a.min_each(&b), Resources::new(2, 0, 2 << 30));
        assert!(Shape::from_flags(1, 0, 2048).order_key() < Shape::new("g", 1, 1, 0).order_key());
        assert_eq!(
            Shape::from_flags(2, 0, 1).resources,
            Resources::new(2, 0, 1 << 20)
        );
    }
}
