//! The one duration convention of every Kudos flag: a number with a unit, `500ms`, `30s`,
//! `5m`, `1h` (a bare number is seconds, so the older `--*-seconds=2.5` spellings still work).
//!
//! Values above [`MAX`] are refused: a timer that long is a typo, and adding it to a clock
//! reading would overflow (the first wave's daemons panicked on `--probe-interval-seconds=1e300`).

use std::time::Duration;

/// Longest duration any flag accepts: seven days.
pub const MAX: Duration = Duration::from_secs(7 * 24 * 3600);

/// Why a duration flag value is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// Not a number followed by an optional unit.
    #[error("{0:?} is not a duration (use e.g. 500ms, 30s, 5m, 1h)")]
    Syntax(String),
    /// A unit other than ms, s, m, h.
    #[error("unknown unit {0:?} (use ms, s, m or h)")]
    Unit(String),
    /// Longer than [`MAX`].
    #[error("{0:?} is longer than the maximum of 7 days")]
    TooLong(String),
    /// Zero where a positive duration is needed.
    #[error("{0:?} must be greater than zero")]
    Zero(String),
}

/// Parses a duration of zero or more, at most [`MAX`].
pub fn parse(text: &str) -> Result<Duration, DurationError> {
    let s = text.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| DurationError::Syntax(text.to_owned()))?;
    let scale = match unit.trim() {
        "" | "s" => 1.0,
        "ms" => 1e-3,
        "m" => 60.0,
        "h" => 3600.0,
        u => return Err(DurationError::Unit(u.to_owned())),
    };
    let secs = value * scale;
    if !secs.is_finite() || secs > MAX.as_secs_f64() {
        return Err(DurationError::TooLong(text.to_owned()));
    }
    // Finite, non-negative (no sign is accepted) and at most MAX: cannot fail.
    Duration::try_from_secs_f64(secs).map_err(|_| DurationError::TooLong(text.to_owned()))
}

/// Parses a duration greater than zero, at most [`MAX`]; for periods and timeouts.
pub fn parse_positive(text: &str) -> Result<Duration, DurationError> {
    match parse(text)? {
        d if d.is_zero() => Err(DurationError::Zero(text.to_owned())),
        d => Ok(d),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_and_bare_seconds() {
        assert_eq!(parse("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse("0"), Ok(Duration::ZERO));
        assert!(matches!(parse("fast"), Err(DurationError::Syntax(_))));
        assert!(matches!(parse("-1s"), Err(DurationError::Syntax(_))));
        assert!(matches!(parse("1d"), Err(DurationError::Unit(_))));
        assert!(matches!(parse_positive("0s"), Err(DurationError::Zero(_))));
    }

    #[test]
    fn huge_values_are_errors_not_panics() {
        for huge in [
            "1e300",
            "1e300s",
            "18446744073709551616",
            "169h",
            "99999999999999h",
        ] {
            assert!(parse(huge).is_err(), "{huge}");
        }
        assert_eq!(parse("168h"), Ok(MAX));
    }
}
