//! [`Allowed`]: the hosts and origins a request may come from, from `--allowed-hosts`
//! and `--cors-origin` (the rules are in `guard`'s module doc; the guard applies
//! them before any route).

/// Which origins and hosts the server accepts, from the settings.
#[derive(Debug, Clone, Default)]
pub struct Allowed {
    /// `--cors-origin` values (lower case); `*` allows every origin.
    pub origins: Vec<String>,
    /// `--allowed-hosts` values (lower case); `*` allows every host, `.example.com`
    /// the name and every name under it.
    pub hosts: Vec<String>,
}

impl Allowed {
    pub fn new(origins: &[String], hosts: &[String]) -> Self {
        let lower = |v: &[String]| v.iter().map(|s| s.trim().to_ascii_lowercase()).collect();
        Self {
            origins: lower(origins),
            hosts: lower(hosts),
        }
    }

    fn any_origin(&self) -> bool {
        self.origins.iter().any(|o| o == "*")
    }

    /// Whether a Host header's name (port stripped) may reach the server.
    pub fn host(&self, host: &str) -> bool {
        let name = strip_port(host).to_ascii_lowercase();
        if name.parse::<std::net::IpAddr>().is_ok() || is_bracketed_v6(&name) {
            return true;
        }
        if name == "localhost" || name.ends_with(".localhost") {
            return true;
        }
        self.hosts.iter().any(|h| {
            h == "*"
                || *h == name
                || (h.starts_with('.') && (name.ends_with(h.as_str()) || name == h[1..]))
        })
    }

    /// Whether a request with this Origin may act, given its Host.
    pub fn origin(&self, origin: &str, host: Option<&str>) -> bool {
        let o = origin.trim().to_ascii_lowercase();
        if self.any_origin() || self.origins.contains(&o) {
            return true;
        }
        // The server's own page: the origin's authority is the Host the browser used.
        let authority = o
            .strip_prefix("http://")
            .or_else(|| o.strip_prefix("https://"));
        match (authority, host) {
            (Some(a), Some(h)) => a == h.to_ascii_lowercase(),
            _ => false,
        }
    }
}

fn is_bracketed_v6(name: &str) -> bool {
    name.strip_prefix('[')
        .and_then(|n| n.strip_suffix(']'))
        .is_some_and(|n| n.parse::<std::net::Ipv6Addr>().is_ok())
}

/// `name:port` → `name` (a bracketed IPv6 literal keeps its brackets).
pub fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        return host.find(']').map_or(host, |i| &host[..=i]);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowed(origins: &[&str], hosts: &[&str]) -> Allowed {
        let v = |x: &[&str]| x.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        Allowed::new(&v(origins), &v(hosts))
    }

    #[test]
    fn hosts_by_default_are_ip_literals_and_localhost() {
        let a = allowed(&[], &[]);
        for h in [
            "127.0.0.1",
            "127.0.0.1:8080",
            "localhost:8080",
            "LocalHost",
            "app.localhost:1",
            "[::1]:8080",
            "[::1]",
            "10.1.2.3:80",
        ] {
            assert!(a.host(h), "{h}");
        }
        for h in [
            "attacker.example",
            "attacker.example:8080",
            "localhost.evil.com",
            "evil",
        ] {
            assert!(!a.host(h), "{h}");
        }
    }

    #[test]
    fn allowed_hosts_extend_the_names() {
        let a = allowed(&[], &["box.lan", ".corp.example"]);
        assert!(a.host("box.lan:8080"));
        assert!(a.host("corp.example"));
        assert!(a.host("gpu1.corp.example:80"));
        assert!(!a.host("evilcorp.example"));
        assert!(!a.host("box.lan.evil"));
        assert!(allowed(&[], &["*"]).host("anything.example"));
    }

    #[test]
    fn origins_are_the_servers_own_or_listed() {
        let a = allowed(&["http://good.example"], &[]);
        assert!(a.origin("http://127.0.0.1:8080", Some("127.0.0.1:8080")));
        assert!(a.origin("http://good.example", Some("127.0.0.1:8080")));
        assert!(a.origin("HTTP://GOOD.EXAMPLE", None));
        for o in [
            "http://evil.example",
            "null",
            "http://good.example.evil.com",
            "http://good.example:80",
            "http://127.0.0.1:9999",
        ] {
            assert!(!a.origin(o, Some("127.0.0.1:8080")), "{o}");
        }
        assert!(allowed(&["*"], &[]).origin("http://evil.example", None));
    }
}
