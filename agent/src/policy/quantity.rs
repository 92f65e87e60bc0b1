//! Kubernetes `resource.Quantity`: parsing, exact arithmetic, rounding and the canonical string.
//!
//! Mirrors apimachinery `pkg/api/resource/quantity.go`. A value is `mantissa * 10^scale` in
//! `i128`, so binary suffixes (powers of 1024), decimal suffixes and fractions stay exact. As
//! upstream, precision finer than 1n is rounded up (away from zero) at parse time, and
//! conversions to integers (`value`, `milli_value`) round up.

use std::{cmp::Ordering, fmt, str::FromStr};

use thiserror::Error;

/// Largest |scale| we accept; far beyond any resource, and keeps `10^scale` inside `i128`.
const MAX_SCALE: i32 = 30;

/// How a quantity prints, as upstream `resource.Format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub(crate) enum Format {
    /// `Ki`, `Mi`, ... (powers of 1024).
    BinarySI,
    /// `n`, `u`, `m`, `""`, `k`, `M`, ... (powers of 1000).
    DecimalSI,
    /// `1e9`, `129e6`.
    DecimalExponent,
}

/// A malformed quantity; the message names the text.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum QuantityError {
    #[error("quantity {text:?}: empty")]
    Empty { text: String },
    #[error("quantity {text:?}: expected a number")]
    NoNumber { text: String },
    #[error("quantity {text:?}: unknown suffix {suffix:?}")]
    UnknownSuffix { text: String, suffix: String },
    #[error("quantity {text:?}: out of range")]
    OutOfRange { text: String },
}

/// An exact Kubernetes quantity.
#[derive(Debug, Clone, Copy)]
pub struct Quantity {
    mantissa: i128,
    scale: i32,
    format: Format,
}

impl Quantity {
    /// `n` units (bytes, CPUs, pids) in the given format.
    pub(crate) fn from_int(n: i64, format: Format) -> Self {
        Self::new(n.into(), 0, format)
    }

    /// `m` thousandths (millicpu), DecimalSI.
    pub(crate) fn from_milli(m: i64) -> Self {
        Self::new(m.into(), -3, Format::DecimalSI)
    }

    fn new(mantissa: i128, scale: i32, format: Format) -> Self {
        let mut q = Self {
            mantissa,
            scale,
            format,
        };
        q.normalize();
        q
    }

    /// Strips trailing decimal zeros so equal values have equal representations.
    fn normalize(&mut self) {
        if self.mantissa == 0 {
            self.scale = 0;
            return;
        }
        while self.mantissa % 10 == 0 && self.scale < MAX_SCALE {
            self.mantissa /= 10;
            self.scale += 1;
        }
    }

    pub(crate) fn format(&self) -> Format {
        self.format
    }

    pub(crate) fn is_zero(&self) -> bool {
        self.mantissa == 0
    }

    /// -1, 0 or 1.
    pub(crate) fn signum(&self) -> i32 {
        self.mantissa.signum() as i32
    }

    /// The value scaled to `10^-scale` units, rounded up (away from zero) as upstream
    /// `ScaledValue`, saturating at the `i64` range.
    pub(crate) fn scaled_value(&self, scale: i32) -> i64 {
        let shift = self.scale - scale;
        let v = if shift >= 0 {
            pow10(shift).and_then(|p| self.mantissa.checked_mul(p))
        } else {
            pow10(-shift).map(|p| {
                let (q, r) = (self.mantissa / p, self.mantissa % p);
                q + r.signum()
            })
        };
        match v {
            Some(v) => v.clamp(i64::MIN.into(), i64::MAX.into()) as i64,
            None if self.mantissa < 0 => i64::MIN,
            None => i64::MAX,
        }
    }

    /// Whole units, rounded up (upstream `Value`): bytes for memory.
    pub fn value(&self) -> i64 {
        self.scaled_value(0)
    }

    /// Thousandths, rounded up (upstream `MilliValue`): millicpu.
    pub fn milli_value(&self) -> i64 {
        self.scaled_value(-3)
    }

    /// Exact sum. As upstream `Add`, a zero receiver takes the format of `other`.
    pub(crate) fn checked_add(&self, other: &Quantity) -> Option<Quantity> {
        let format = if self.is_zero() {
            other.format
        } else {
            self.format
        };
        let scale = self.scale.min(other.scale);
        let a = self.mantissa.checked_mul(pow10(self.scale - scale)?)?;
        let b = other.mantissa.checked_mul(pow10(other.scale - scale)?)?;
        Some(Self::new(a.checked_add(b)?, scale, format))
    }

    /// Exact difference, with the receiver's format.
    pub(crate) fn checked_sub(&self, other: &Quantity) -> Option<Quantity> {
        let neg = Quantity {
            mantissa: other.mantissa.checked_neg()?,
            ..*other
        };
        let mut r = self.checked_add(&neg)?;
        r.format = self.format;
        Some(r)
    }

    /// The canonical string, as upstream `String()`.
    pub(crate) fn canonical(&self) -> String {
        if self.mantissa == 0 {
            return "0".into();
        }
        // Upstream shows small (|v| < 1024) or fractional binary values as DecimalSI, so
        // nothing is rounded away.
        let integer = pow10(self.scale).and_then(|p| self.mantissa.checked_mul(p));
        let decimal_si = match (self.format, integer) {
            (Format::BinarySI, Some(v)) if v.abs() >= 1024 => return base1024(v),
            (Format::DecimalExponent, _) => false,
            _ => true,
        };
        // Exponent to a multiple of 3, mantissa grown to match (upstream AsCanonicalBytes). A sum
        // can hold a mantissa that would overflow when grown: it prints with its own exponent.
        let (mut m, mut e) = (self.mantissa, self.scale);
        let grow = match e.rem_euclid(3) {
            1 => Some(10),
            2 => Some(100),
            _ => None,
        };
        if let Some(g) = grow {
            match m.checked_mul(g) {
                Some(grown) => (m, e) = (grown, e - e.rem_euclid(3)),
                None => return format!("{m}e{e}"),
            }
        }
        let suffix = decimal_si.then(|| decimal_suffix(e)).flatten();
        match (suffix, e) {
            (Some(s), _) => format!("{m}{s}"),
            (None, 0) => format!("{m}"),
            (None, e) => format!("{m}e{e}"),
        }
    }
}

/// `v` with as many factors of 1024 as possible moved into a binary suffix.
fn base1024(mut v: i128) -> String {
    let mut exp = 0;
    while exp < 6 && v % 1024 == 0 {
        v /= 1024;
        exp += 1;
    }
    let suffix = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"][exp];
    format!("{v}{suffix}")
}

fn pow10(e: i32) -> Option<i128> {
    if !(0..=38).contains(&e) {
        return None;
    }
    10i128.checked_pow(e as u32)
}

fn decimal_suffix(exp: i32) -> Option<&'static str> {
    Some(match exp {
        -9 => "n",
        -6 => "u",
        -3 => "m",
        0 => "",
        3 => "k",
        6 => "M",
        9 => "G",
        12 => "T",
        15 => "P",
        18 => "E",
        _ => return None,
    })
}

impl PartialEq for Quantity {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Quantity {}

impl PartialOrd for Quantity {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Quantity {
    /// Compares values, ignoring the format (upstream `Cmp`).
    fn cmp(&self, other: &Self) -> Ordering {
        match self.checked_sub(other) {
            Some(d) => d.mantissa.cmp(&0),
            // Only on overflow, i.e. wildly different magnitudes: the sign decides.
            None => self.mantissa.signum().cmp(&other.mantissa.signum()),
        }
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.canonical())
    }
}

impl FromStr for Quantity {
    type Err = QuantityError;

    /// Parses `<sign>?<digits>(.<digits>)?<suffix>`, the grammar of upstream `ParseQuantity`.
    fn from_str(text: &str) -> Result<Self, QuantityError> {
        let err_range = || QuantityError::OutOfRange { text: text.into() };
        if text.is_empty() {
            return Err(QuantityError::Empty { text: text.into() });
        }
        let (negative, rest) = match text.as_bytes()[0] {
            b'-' => (true, &text[1..]),
            b'+' => (false, &text[1..]),
            _ => (false, text),
        };
        let int_len = rest.bytes().take_while(u8::is_ascii_digit).count();
        let (int_digits, mut rest) = rest.split_at(int_len);
        let mut frac_digits = "";
        if let Some(after_dot) = rest.strip_prefix('.') {
            let frac_len = after_dot.bytes().take_while(u8::is_ascii_digit).count();
            (frac_digits, rest) = after_dot.split_at(frac_len);
        }
        if int_digits.is_empty() && frac_digits.is_empty() {
            return Err(QuantityError::NoNumber { text: text.into() });
        }
        let digits = format!("{int_digits}{frac_digits}");
        let digits = digits.trim_start_matches('0');
        // Trailing zeros go to the exponent before the length check: the canonical string pads
        // the mantissa with up to two zeros to reach a multiple of 3 (fuzz target `quantity`
        // found `136666666666666666666666666666666668E+5`, whose canonical form did not parse).
        let significant = digits.trim_end_matches('0');
        let zeros = (digits.len() - significant.len()) as i32;
        if significant.len() > 36 {
            return Err(err_range());
        }
        let mut mantissa: i128 = if significant.is_empty() {
            0
        } else {
            significant.parse().map_err(|_| err_range())?
        };
        let mut scale = zeros - (frac_digits.len() as i32);
        let (format, exp10, pow1024) =
            parse_suffix(rest).ok_or_else(|| QuantityError::UnknownSuffix {
                text: text.into(),
                suffix: rest.into(),
            })?;
        scale = scale.checked_add(exp10).ok_or_else(err_range)?;
        if pow1024 > 0 {
            let factor = 1024i128.pow(pow1024);
            mantissa = mantissa.checked_mul(factor).ok_or_else(err_range)?;
        }
        if negative {
            mantissa = -mantissa;
        }
        // Upstream rounds anything finer than nano up, away from zero.
        if scale < -9 && mantissa != 0 {
            let p = pow10(-9 - scale).ok_or_else(err_range)?;
            mantissa = mantissa / p + (mantissa % p).signum();
            scale = -9;
        }
        let mut q = Quantity {
            mantissa,
            scale,
            format,
        };
        q.normalize();
        // At most 36 significant digits after the binary suffix too, so the canonical string
        // (which spells the value in decimal) parses back (fuzz: `1001000000013333333010...0Ei`).
        if q.mantissa.unsigned_abs() >= 10u128.pow(36)
            || q.scale.abs() > MAX_SCALE
            || q.scale > 0 && pow10(q.scale).is_none()
        {
            return Err(err_range());
        }
        Ok(q)
    }
}

/// `(format, power of ten, power of 1024)` for a suffix.
fn parse_suffix(s: &str) -> Option<(Format, i32, u32)> {
    use Format::*;
    Some(match s {
        "Ki" => (BinarySI, 0, 1),
        "Mi" => (BinarySI, 0, 2),
        "Gi" => (BinarySI, 0, 3),
        "Ti" => (BinarySI, 0, 4),
        "Pi" => (BinarySI, 0, 5),
        "Ei" => (BinarySI, 0, 6),
        "n" => (DecimalSI, -9, 0),
        "u" => (DecimalSI, -6, 0),
        "m" => (DecimalSI, -3, 0),
        "" => (DecimalSI, 0, 0),
        "k" => (DecimalSI, 3, 0),
        "M" => (DecimalSI, 6, 0),
        "G" => (DecimalSI, 9, 0),
        "T" => (DecimalSI, 12, 0),
        "P" => (DecimalSI, 15, 0),
        "E" => (DecimalSI, 18, 0),
        _ => {
            let exp = s.strip_prefix(['e', 'E'])?;
            let digits = exp.strip_prefix(['+', '-']).unwrap_or(exp);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) || digits.len() > 4
            {
                return None;
            }
            (DecimalExponent, exp.parse().ok()?, 0)
        }
    })
}

#[cfg(test)]
mod tests;
