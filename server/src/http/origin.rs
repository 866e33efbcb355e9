//! Matching browser `Origin`s against the allowed patterns, for CORS and the resume middleware
//! (rmcp validates `Origin` on `/mcp` itself, from the same patterns).

/// Whether `origin` matches one of `patterns`.
pub(super) fn allowed(patterns: &[String], origin: &str) -> bool {
    patterns
        .iter()
        .any(|pattern| origin_matches(pattern, origin))
}

/// `pattern` is an origin, optionally with `:*` for any port. Scheme and host compare without
/// regard to case, as rmcp compares them (RFC 6454 origins are lowercase).
fn origin_matches(pattern: &str, origin: &str) -> bool {
    let (pattern, origin) = (pattern.to_ascii_lowercase(), origin.to_ascii_lowercase());
    match pattern.strip_suffix(":*") {
        Some(prefix) => origin.strip_prefix(prefix).is_some_and(|rest| {
            rest.is_empty()
                || rest
                    .strip_prefix(':')
                    .is_some_and(|port| port.parse::<u16>().is_ok())
        }),
        None => *pattern == origin,
    }
}

#[cfg(test)]
mod tests {
    use super::origin_matches;

    #[test]
    fn port_wildcards_match_only_ports() {
        assert!(origin_matches(
            "http://localhost:*",
            "http://localhost:8081"
        ));
        assert!(origin_matches("http://localhost:*", "http://localhost"));
        assert!(!origin_matches(
            "http://localhost:*",
            "http://localhost.evil.com"
        ));
        assert!(!origin_matches(
            "http://localhost:*",
            "http://localhost:80x"
        ));
        assert!(origin_matches(
            "https://ops.example.com",
            "https://ops.example.com"
        ));
        assert!(origin_matches(
            "http://localhost:*",
            "HTTP://LocalHost:8081"
        ));
        assert!(!origin_matches(
            "https://ops.example.com",
            "https://ops.example.com:444"
        ));
    }
}
