//! What crosses the network in clear: plain-HTTP URLs to other machines.

use std::net::IpAddr;

/// Whether `host` (a URL's host as written, IPv6 in brackets or not) names this machine:
/// `localhost` (and its subdomains), 127.0.0.0/8 or ::1.
pub fn is_loopback_host(host: &str) -> bool {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    let lower = h.to_ascii_lowercase();
    if lower == "localhost" || lower.ends_with(".localhost") {
        return true;
    }
    h.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Whether `url` is plain (`http://`, `tcp://`) to a host other than this machine: a password,
/// token or API call sent there can be read (and changed) by anyone on the way.
pub fn is_plaintext_remote(url: &str) -> bool {
    let Ok(u) = reqwest::Url::parse(url) else {
        return false;
    };
    // (The parser lower-cases the scheme.)
    if !matches!(u.scheme(), "http" | "tcp") {
        return false;
    }
    u.host_str()
        .is_some_and(|host| !host.is_empty() && !is_loopback_host(host))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plaintext_to_other_hosts_only() {
        for url in [
            "http://codalab.example.org",
            "http://10.0.0.5:2900/rest",
            "tcp://192.168.1.4:2375",
            "HTTP://user:pw@worksheets.org:80/",
            "http://[2001:db8::1]:8080",
        ] {
            assert!(is_plaintext_remote(url), "{url}");
        }
        for url in [
            "https://worksheets.codalab.org",
            "http://127.0.0.1:2900",
            "http://localhost/rest",
            "tcp://127.0.0.53:2375",
            "http://[::1]:80",
            "unix:///var/run/docker.sock",
            "not a url",
        ] {
            assert!(!is_plaintext_remote(url), "{url}");
        }
    }
}
