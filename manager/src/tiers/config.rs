//! The `[[tier]]` sections of `--config`: several backends in one manager, in priority order.
//!
//! ```toml
//! [[tier]]
//! name = "campus"                # unique; names the tier in logs, /status and /metrics
//! backend = "slurm-batch"        # a backend subcommand of cl-worker-manager
//! max-workers = 1                # this tier's cap (the global --max-workers holds too)
//! overflow-after = 600           # seconds a bundle waits for this tier before the next may take it
//! price-per-hour = 0.0           # of the default shape (--cpus/--gpus/--memory-mb of its flags)
//! budget = 0.0                   # per calendar month (UTC), in the prices' unit; none: unbounded
//! [tier.flags]                   # the backend's own flags, named as on its command line
//! partition = "gpu"
//! cpus = 4
//! memory-mb = 16384
//! [[tier.shape]]                 # more shapes, as [[shape]], each with its own price
//! name = "gpu"
//! cpus = 8
//! gpus = 1
//! memory_mb = 32768
//! price-per-hour = 2.5
//! ```

use clap::{FromArgMatches, Subcommand};
use serde::Deserialize;

use crate::cli::BackendCommand;
use crate::policy::Resources;

/// One `[[tier]]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct TierEntry {
    pub name: String,
    pub backend: String,
    /// The backend's flags: `key = value` for `--key value`, `key = true` for `--key`, a list
    /// for a repeated flag.
    #[serde(default)]
    pub flags: toml::Table,
    pub max_workers: Option<u32>,
    /// Seconds.
    pub overflow_after: Option<f64>,
    /// Of the default shape.
    pub price_per_hour: Option<f64>,
    /// Per calendar month.
    pub budget: Option<f64>,
    #[serde(default, rename = "shape")]
    pub shapes: Vec<TierShape>,
}

/// One `[[tier.shape]]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TierShape {
    pub name: String,
    pub cpus: u32,
    #[serde(default)]
    pub gpus: u32,
    pub memory_mb: u64,
    #[serde(rename = "price-per-hour")]
    pub price_per_hour: Option<f64>,
}

impl TierShape {
    /// The shape's resources (`memory_mb` in bytes, saturating).
    pub fn resources(&self) -> Resources {
        Resources::from_mb(self.cpus, self.gpus, self.memory_mb)
    }
}

/// Why the `[[tier]]` sections cannot be used. Each message names the tier.
#[derive(Debug, thiserror::Error)]
pub enum TierConfigError {
    /// A flag's value (or an element of its list) is a table, a date or a list.
    #[error("tier {tier:?}: flag {key}: a string, number or boolean expected, not {found}")]
    FlagType {
        tier: String,
        key: String,
        found: &'static str,
    },
    /// The backend subcommand refused its flags (clap's rendered message).
    #[error("tier {tier:?}: {}", .source.render())]
    Flags { tier: String, source: clap::Error },
    /// The matches were not those of a backend subcommand.
    #[error("tier {tier:?}: {source}")]
    Matches { tier: String, source: clap::Error },
    #[error("tier {tier:?}: backend {backend:?} is not a backend")]
    NotABackend { tier: String, backend: String },
    #[error("tier name {0:?} empty or used twice")]
    Name(String),
    #[error(
        "tier {tier:?}: prices, budget and overflow-after are numbers not below 0, not {found}"
    )]
    Negative { tier: String, found: f64 },
}

impl TierEntry {
    /// The backend flags as a command line: `--key value`, `--key` for `true` (nothing for
    /// `false`), one `--key value` per element of a list.
    pub fn argv(&self) -> Result<Vec<String>, TierConfigError> {
        let mut argv = Vec::new();
        for (key, value) in &self.flags {
            let flag = format!("--{key}");
            let mut one = |v: &toml::Value| -> Result<(), TierConfigError> {
                match v {
                    toml::Value::Boolean(true) => argv.push(flag.clone()),
                    toml::Value::Boolean(false) => {}
                    toml::Value::String(s) => argv.extend([flag.clone(), s.clone()]),
                    toml::Value::Integer(n) => argv.extend([flag.clone(), n.to_string()]),
                    toml::Value::Float(x) => argv.extend([flag.clone(), x.to_string()]),
                    other => {
                        return Err(TierConfigError::FlagType {
                            tier: self.name.clone(),
                            key: key.clone(),
                            found: other.type_str(),
                        })
                    }
                }
                Ok(())
            };
            match value {
                toml::Value::Array(items) => items.iter().try_for_each(&mut one)?,
                v => one(v)?,
            }
        }
        Ok(argv)
    }

    /// The backend and its flags, parsed as its subcommand parses them (the same names,
    /// defaults and checks).
    pub fn backend_command(&self) -> Result<BackendCommand, TierConfigError> {
        let argv = self.argv()?;
        let command = BackendCommand::augment_subcommands(
            clap::Command::new("tier").subcommand_required(true),
        );
        let matches = command
            .try_get_matches_from(
                ["tier", self.backend.as_str()]
                    .into_iter()
                    .map(String::from)
                    .chain(argv),
            )
            .map_err(|source| TierConfigError::Flags {
                tier: self.name.clone(),
                source,
            })?;
        let parsed = BackendCommand::from_arg_matches(&matches).map_err(|source| {
            TierConfigError::Matches {
                tier: self.name.clone(),
                source,
            }
        })?;
        if parsed.args().is_none() {
            return Err(TierConfigError::NotABackend {
                tier: self.name.clone(),
                backend: self.backend.clone(),
            });
        }
        Ok(parsed)
    }
}

/// Checks the tiers of a file: at least one, unique names, each backend and its flags as its
/// subcommand accepts them, prices and budgets not negative.
pub fn check(tiers: &[TierEntry]) -> Result<Vec<BackendCommand>, TierConfigError> {
    let mut names = std::collections::BTreeSet::new();
    let mut commands = Vec::new();
    for t in tiers {
        if t.name.is_empty() || !names.insert(t.name.as_str()) {
            return Err(TierConfigError::Name(t.name.clone()));
        }
        let prices = t
            .shapes
            .iter()
            .filter_map(|s| s.price_per_hour)
            .chain(t.price_per_hour)
            .chain(t.budget)
            .chain(t.overflow_after);
        if let Some(bad) = prices.into_iter().find(|x| !x.is_finite() || *x < 0.0) {
            return Err(TierConfigError::Negative {
                tier: t.name.clone(),
                found: bad,
            });
        }
        commands.push(t.backend_command()?);
    }
    Ok(commands)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Vec<TierEntry> {
        #[derive(Deserialize)]
        struct File {
            tier: Vec<TierEntry>,
        }
        toml::from_str::<File>(text).unwrap().tier
    }

    const TWO: &str = r#"
        [[tier]]
        name = "campus"
        backend = "slurm-batch"
        max-workers = 1
        overflow-after = 30
        [tier.flags]
        partition = "debug"
        cpus = 2
        memory-mb = 1024

        [[tier]]
        name = "cloud"
        backend = "aws-batch"
        price-per-hour = 0.1
        budget = 100
        [tier.flags]
        job-queue = "q"
        job-definition-name = "codalab-worker"
        [[tier.shape]]
        name = "gpu"
        cpus = 8
        gpus = 1
        memory_mb = 32768
        price-per-hour = 2.5
    "#;

    #[test]
    fn tiers_parse_and_their_flags_are_the_subcommands() {
        let tiers = parse(TWO);
        assert_eq!(tiers[0].max_workers, Some(1));
        assert_eq!(tiers[1].shapes[0].price_per_hour, Some(2.5));
        let commands = check(&tiers).unwrap();
        match &commands[0] {
            BackendCommand::SlurmBatch(a) => {
                assert_eq!(a.partition, "debug");
                assert_eq!(a.shape.cpus, 2);
                assert_eq!(a.shape.memory_mb, 1024);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(commands[1], BackendCommand::AwsBatch(_)));
    }

    #[test]
    fn a_wrong_flag_or_backend_is_refused_as_its_subcommand_refuses_it() {
        let mut tiers = parse(TWO);
        tiers[0]
            .flags
            .insert("partitoin".into(), toml::Value::String("x".into()));
        let e = check(&tiers).unwrap_err().to_string();
        assert!(e.contains("campus") && e.contains("--partitoin"), "{e}");
        let mut tiers = parse(TWO);
        tiers[1].backend = "gcp".into();
        assert!(check(&tiers).unwrap_err().to_string().contains("cloud"));
        let mut tiers = parse(TWO);
        tiers[1].backend = "status".into();
        assert!(check(&tiers).is_err());
        let mut tiers = parse(TWO);
        tiers[1].name = "campus".into();
        assert!(check(&tiers)
            .unwrap_err()
            .to_string()
            .contains("used twice"));
        let mut tiers = parse(TWO);
        tiers[1].budget = Some(-1.0);
        assert!(matches!(
            check(&tiers),
            Err(TierConfigError::Negative { .. })
        ));
    }

    #[test]
    fn the_example_file_is_checked_as_the_subcommands_check_it() {
        let path = std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../examples/tiers.toml"
        ));
        let f = crate::config::FileConfig::load(path).unwrap();
        assert_eq!(f.tiers.len(), 2);
        let commands = check(&f.tiers).unwrap();
        assert!(matches!(commands[0], BackendCommand::SlurmBatch(_)));
        assert!(matches!(commands[1], BackendCommand::AwsBatch(_)));
        assert_eq!(f.tiers[1].shapes[0].price_per_hour, Some(1.2));
    }

    #[test]
    fn booleans_and_lists_become_flags() {
        let tiers = parse(
            r#"
            [[tier]]
            name = "k"
            backend = "local"
            [tier.flags]
            a = true
            b = false
            c = ["x", "y"]
            d = 1.5
        "#,
        );
        assert_eq!(
            tiers[0].argv().unwrap(),
            ["--a", "--c", "x", "--c", "y", "--d", "1.5"]
        );
    }
}
