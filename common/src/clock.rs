//! The wall clock, as CodaLab's wire format wants it: seconds since the Unix epoch.

use std::time::{SystemTime, UNIX_EPOCH};

/// Seconds since the Unix epoch (0.0 if the clock is before it).
pub fn now_unix() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn now_is_after_2020() {
        assert!(super::now_unix() > 1_577_836_800.0);
    }
}
