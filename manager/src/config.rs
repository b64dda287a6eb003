//! The optional TOML configuration file (`--config`): more worker shapes than the backend flags'
//! default one, and the policy's throttling knobs.
//!
//! ```toml
//! [policy]                      # every key optional; these are the defaults
//! launch_burst = 50             # largest number of workers launched in one tick
//! launch_rate_per_sec = 1.0     # token-bucket refill
//! breaker_failure_threshold = 5 # consecutive submit failures that open the breaker
//! breaker_cooldown_secs = 300.0
//! backoff_base_secs = 5.0
//! backoff_max_secs = 300.0
//!
//! [[shape]]                     # added after the default shape of --cpus/--gpus/--memory-mb
//! name = "gpu"
//! cpus = 8
//! gpus = 1
//! memory_mb = 32768
//! ```

use std::path::Path;

use serde::Deserialize;

use crate::policy::{Config, Resources, Shape};

/// The file's contents.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    #[serde(default)]
    pub policy: PolicyKnobs,
    #[serde(default, rename = "shape")]
    pub shapes: Vec<ShapeEntry>,
    /// Several backends (`cl-worker-manager --config FILE` without a backend subcommand).
    #[serde(default, rename = "tier")]
    pub tiers: Vec<crate::tiers::config::TierEntry>,
}

/// `[policy]`: overrides of [`Config::with_default_shape`]'s throttling values.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyKnobs {
    pub launch_burst: Option<u32>,
    pub launch_rate_per_sec: Option<f64>,
    pub breaker_failure_threshold: Option<u32>,
    pub breaker_cooldown_secs: Option<f64>,
    pub backoff_base_secs: Option<f64>,
    pub backoff_max_secs: Option<f64>,
}

/// One `[[shape]]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShapeEntry {
    pub name: String,
    pub cpus: u32,
    #[serde(default)]
    pub gpus: u32,
    pub memory_mb: u64,
}

impl ShapeEntry {
    /// The shape's resources (`memory_mb` in bytes, saturating).
    pub fn resources(&self) -> Resources {
        Resources::from_mb(self.cpus, self.gpus, self.memory_mb)
    }
}

impl FileConfig {
    /// Reads and parses the file; errors name the file and, for syntax errors, the line.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("cannot read --config {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| anyhow::anyhow!("--config {}: {e}", path.display()))
    }

    pub fn parse(text: &str) -> Result<Self, toml::de::Error> {
        toml::from_str(text)
    }

    /// Applies the file to a configuration built from the flags: extra shapes after the default
    /// one, then the knobs. [`Config::validate`] still has to be called.
    pub fn apply(&self, config: &mut Config) {
        for s in &self.shapes {
            config.shapes.push(Shape {
                name: s.name.clone(),
                resources: s.resources(),
            });
        }
        self.apply_knobs(config);
    }

    /// Applies the `[policy]` knobs only (each tier has its own shapes).
    pub fn apply_knobs(&self, config: &mut Config) {
        let k = &self.policy;
        if let Some(v) = k.launch_burst {
            config.launch_burst = v;
        }
        if let Some(v) = k.launch_rate_per_sec {
            config.launch_rate_per_sec = v;
        }
        if let Some(v) = k.breaker_failure_threshold {
            config.breaker_failure_threshold = v;
        }
        if let Some(v) = k.breaker_cooldown_secs {
            config.breaker_cooldown_secs = v;
        }
        if let Some(v) = k.backoff_base_secs {
            config.backoff_base_secs = v;
        }
        if let Some(v) = k.backoff_max_secs {
            config.backoff_max_secs = v;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::ConfigError;

    const EXAMPLE: &str = r#"
        [policy]
        launch_burst = 20
        backoff_max_secs = 60.0

        [[shape]]
        name = "cpu-large"
        cpus = 8
        memory_mb = 16384

        [[shape]]
        name = "gpu"
        cpus = 8
        gpus = 1
        memory_mb = 32768
    "#;

    #[test]
    fn shapes_follow_the_default_and_knobs_override() {
        let f = FileConfig::parse(EXAMPLE).unwrap();
        let mut c = Config::with_default_shape(Shape::from_flags(1, 0, 2048));
        f.apply(&mut c);
        c.validate().unwrap();
        let names: Vec<&str> = c.shapes.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["default", "cpu-large", "gpu"]);
        assert_eq!(c.shapes[2], Shape::new("gpu", 8, 1, 32768 << 20));
        assert_eq!(c.launch_burst, 20);
        assert_eq!(c.backoff_max_secs, 60.0);
        assert_eq!(c.launch_rate_per_sec, 1.0);
    }

    #[test]
    fn the_example_file_parses() {
        let path = Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../examples/manager.toml"
        ));
        let f = FileConfig::load(path).unwrap();
        let mut c = Config::with_default_shape(Shape::from_flags(1, 0, 2048));
        f.apply(&mut c);
        c.validate().unwrap();
        assert_eq!(c.shapes.len(), 2);
        assert_eq!(c.launch_burst, 10);
    }

    #[test]
    fn mistakes_are_refused() {
        // A misspelt key is an error, not silently ignored.
        let e = FileConfig::parse("[policy]\nlaunch_brust = 3\n").unwrap_err();
        assert!(e.to_string().contains("launch_brust"), "{e}");
        assert!(FileConfig::parse("[[shape]]\nname = \"x\"\ncpus = 1\n").is_err());
        // A shape named like the default one is caught by validation.
        let f =
            FileConfig::parse("[[shape]]\nname = \"default\"\ncpus = 2\nmemory_mb = 1\n").unwrap();
        let mut c = Config::with_default_shape(Shape::from_flags(1, 0, 2048));
        f.apply(&mut c);
        assert_eq!(
            c.validate(),
            Err(ConfigError::DuplicateShape("default".into()))
        );
        let e = FileConfig::load(Path::new("/nonexistent/x.toml")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/x.toml"), "{e}");
    }
}
