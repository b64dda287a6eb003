//! Human-readable sizes and durations, and size parsing, in CodaLab's formats (the failure
//! messages the server stores are built from these, so they must match to the character).

/// `size_str`: 1024-based, units `''`, `k`, `m`, `g`, `t`; one decimal below 100 for
/// non-integers.
pub fn size_str(size: f64) -> String {
    let mut size = size;
    for unit in ["", "k", "m", "g", "t"] {
        if size < 100.0 && size != size.trunc() {
            return format!("{size:.1}{unit}");
        }
        if size < 1024.0 || unit == "t" {
            return format!("{}{unit}", size.trunc() as i64);
        }
        size /= 1024.0;
    }
    unreachable!("the loop returns at the last unit")
}

/// `duration_str`: `3.2s`, `1m40s`, `2h46m`, `3d4h`, `1y2d`.
pub fn duration_str(secs: f64) -> String {
    let mut s = secs;
    let mut m = (s / 60.0).floor() as i64;
    if m == 0 {
        return format!("{s:.1}s");
    }
    s -= (m * 60) as f64;
    let mut h = m / 60;
    if h == 0 {
        return format!("{m}m{}s", s.trunc() as i64);
    }
    m -= h * 60;
    let mut d = h / 24;
    if d == 0 {
        return format!("{h}h{m}m");
    }
    h -= d * 24;
    let y = d / 365;
    if y == 0 {
        return format!("{d}d{h}h");
    }
    d -= y * 365;
    format!("{y}y{d}d")
}

pub use protocol::parse_size;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(size_str(0.0), "0");
        assert_eq!(size_str(1000.0), "1000");
        assert_eq!(size_str(1024.0), "1k");
        assert_eq!(size_str(1536.0), "1.5k");
        assert_eq!(size_str(64.0 * 1024.0 * 1024.0), "64m");
        assert_eq!(size_str(2.0 * 1024.0 * 1024.0 * 1024.0), "2g");
        assert_eq!(size_str(150.5 * 1024.0), "150k");
        assert_eq!(size_str(10.0 * 1024f64.powi(4)), "10t");
        assert_eq!(size_str(5000.0 * 1024f64.powi(4)), "5000t");
    }

    #[test]
    fn durations() {
        assert_eq!(duration_str(3.0), "3.0s");
        assert_eq!(duration_str(3.26), "3.3s");
        assert_eq!(duration_str(100.0), "1m40s");
        assert_eq!(duration_str(10000.0), "2h46m");
        assert_eq!(duration_str(90000.0), "1d1h");
        assert_eq!(duration_str(366.0 * 86400.0), "1y1d");
    }

    #[test]
    fn parse() {
        assert_eq!(parse_size("10g"), Ok(10 << 30));
        assert_eq!(parse_size("3"), Ok(3));
        assert_eq!(parse_size("1.5K"), Ok(1536));
        assert_eq!(parse_size("64m"), Ok(64 << 20));
        assert!(parse_size("").is_err());
        assert!(parse_size("10x").is_err());
        assert!(parse_size("g").is_err());
        assert!(parse_size("-1g").is_err());
    }
}
