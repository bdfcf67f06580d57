//! Kubernetes resource quantities (`500m`, `2`, `16Gi`, `1e3`) to integers.
//!
//! k8s-openapi keeps quantities as strings; the extender needs numbers for CPU (millicores),
//! memory (bytes) and device counts. Malformed quantities are treated as absent (the API server
//! validates them, so this only matters for hand-written extender input).

/// Parses a quantity to its value times `scale` (1000 for milli-units, 1 for plain units),
/// rounding up as Kubernetes does. `None` if malformed, negative or out of range.
pub fn parse_scaled(q: &str, scale: f64) -> Option<u64> {
    let q = q.trim();
    if q.is_empty() {
        return None;
    }
    let suffixes: [(&str, f64); 14] = [
        ("Ki", 1024.0),
        ("Mi", 1024f64.powi(2)),
        ("Gi", 1024f64.powi(3)),
        ("Ti", 1024f64.powi(4)),
        ("Pi", 1024f64.powi(5)),
        ("Ei", 1024f64.powi(6)),
        ("n", 1e-9),
        ("u", 1e-6),
        ("m", 1e-3),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
        ("P", 1e15),
    ];
    let (num, mult) = suffixes
        .iter()
        .find_map(|(s, m)| q.strip_suffix(s).map(|n| (n, *m)))
        .or_else(|| q.strip_suffix('E').map(|n| (n, 1e18)))
        .unwrap_or((q, 1.0));
    if num.is_empty()
        || !num
            .chars()
            .all(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '+' | '-'))
    {
        return None;
    }
    let v: f64 = num.parse().ok()?;
    let scaled = (v * mult * scale).ceil();
    if !scaled.is_finite() || scaled < 0.0 || scaled > u64::MAX as f64 {
        return None;
    }
    Some(scaled as u64)
}

/// Millicores (or milli-units) of a quantity.
pub fn milli(q: &str) -> Option<u64> {
    parse_scaled(q, 1000.0)
}

/// Whole units (bytes, devices) of a quantity.
pub fn units(q: &str) -> Option<u64> {
    parse_scaled(q, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_common_forms() {
        assert_eq!(milli("500m"), Some(500));
        assert_eq!(milli("2"), Some(2000));
        assert_eq!(milli("0.5"), Some(500));
        assert_eq!(units("16Gi"), Some(16 << 30));
        assert_eq!(units("1G"), Some(1_000_000_000));
        assert_eq!(units("1e3"), Some(1000));
        assert_eq!(units("4"), Some(4));
        assert_eq!(units("x"), None);
        assert_eq!(units("-1"), None);
        assert_eq!(units(""), None);
    }
}
