//! Go `time.ParseDuration` for config fields such as `1m30s` (whole seconds are enough here).

use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("invalid duration {text:?}")]
pub(crate) struct DurationError {
    pub(crate) text: String,
}

/// Parses `300ms`, `1m30s`, `1h`, `0` into seconds, rounding sub-second parts down.
pub(crate) fn parse_duration(text: &str) -> Result<u64, DurationError> {
    parse_duration_nanos(text).map(|ns| (ns / 1_000_000_000) as u64)
}

/// Parses a Go duration into nanoseconds (negative durations are errors here).
pub(crate) fn parse_duration_nanos(text: &str) -> Result<u128, DurationError> {
    let err = || DurationError { text: text.into() };
    let s = text.strip_prefix('+').unwrap_or(text);
    if s == "0" {
        return Ok(0);
    }
    if s.is_empty() || s.starts_with('-') {
        return Err(err());
    }
    let mut total: u128 = 0;
    let mut rest = s;
    while !rest.is_empty() {
        let n = rest
            .bytes()
            .take_while(|b| b.is_ascii_digit() || *b == b'.')
            .count();
        let (num, tail) = rest.split_at(n);
        let u = tail
            .bytes()
            .take_while(|b| !b.is_ascii_digit() && *b != b'.')
            .count();
        let (unit, tail) = tail.split_at(u);
        let scale: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return Err(err()),
        };
        let (int, frac) = num.split_once('.').unwrap_or((num, ""));
        if int.is_empty() && frac.is_empty() {
            return Err(err());
        }
        let int: u128 = if int.is_empty() {
            0
        } else {
            int.parse().map_err(|_| err())?
        };
        let mut value = int.checked_mul(scale).ok_or_else(err)?;
        let mut place = scale;
        for d in frac.bytes().take(18) {
            place /= 10;
            value += u128::from(d - b'0') * place;
        }
        total = total.checked_add(value).ok_or_else(err)?;
        rest = tail;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_durations() {
        assert_eq!(parse_duration("1m30s"), Ok(90));
        assert_eq!(parse_duration("5m"), Ok(300));
        assert_eq!(parse_duration("1h0m0s"), Ok(3600));
        assert_eq!(parse_duration("0"), Ok(0));
        assert_eq!(parse_duration("1.5s"), Ok(1));
        assert_eq!(parse_duration_nanos("100ms"), Ok(100_000_000));
        assert_eq!(parse_duration_nanos("1.5h"), Ok(5_400_000_000_000));
        for bad in ["", "1", "1x", "-1s", "s", "1m30"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
