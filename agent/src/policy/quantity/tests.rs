use proptest::prelude::*;

use super::*;

fn q(s: &str) -> Quantity {
    s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
}

#[test]
fn parses_the_grammar_to_exact_bytes_and_millis() {
    let cases: &[(&str, i64, i64)] = &[
        // text, value (rounded up), milli value (rounded up)
        ("0", 0, 0),
        ("1", 1, 1000),
        ("100m", 1, 100),
        ("0.5", 1, 500),
        ("1.5", 2, 1500),
        (".5", 1, 500),
        ("5.", 5, 5000),
        ("+2", 2, 2000),
        ("-2", -2, -2000),
        ("1Ki", 1024, 1_024_000),
        ("32Gi", 34_359_738_368, 34_359_738_368_000),
        ("1.5Gi", 1_610_612_736, 1_610_612_736_000),
        ("1Ei", 1_152_921_504_606_846_976, i64::MAX),
        ("1e9", 1_000_000_000, 1_000_000_000_000),
        ("129e6", 129_000_000, 129_000_000_000),
        ("1E3", 1000, 1_000_000),
        ("1e-3", 1, 1),
        ("1E", 1_000_000_000_000_000_000, i64::MAX),
        ("1n", 1, 1),
        ("1500u", 1, 2),
        ("1k", 1000, 1_000_000),
        ("2M", 2_000_000, 2_000_000_000),
        ("100Mi", 104_857_600, 104_857_600_000),
        ("0.1", 1, 100),
        ("0.0001", 1, 1),
    ];
    for &(text, value, milli) in cases {
        let parsed = q(text);
        assert_eq!(parsed.value(), value, "{text} value");
        assert_eq!(parsed.milli_value(), milli, "{text} milli");
    }
}

#[test]
fn canonical_strings_match_upstream() {
    let cases = [
        ("0.5", "500m"),
        ("1.5", "1500m"),
        ("1000m", "1"),
        ("1e9", "1e9"),
        ("129e6", "129e6"),
        ("1E3", "1e3"),
        ("1000", "1k"),
        ("1024Mi", "1Gi"),
        ("1536", "1536"),
        ("1.5Ki", "1536"),
        ("1000Ki", "1000Ki"),
        ("0.5Ki", "512"),
        ("1.1Ki", "1126400m"),
        ("10n", "10n"),
        ("0.0000000001", "1n"),
        ("-1Gi", "-1Gi"),
        ("1000G", "1T"),
    ];
    for (text, canonical) in cases {
        assert_eq!(q(text).canonical(), canonical, "{text}");
    }
}

#[test]
fn rejects_malformed_text_naming_it() {
    for text in ["", "abc", "1Kb", "1.2.3", "--1", "1e", "1 Gi", "Gi", "."] {
        let err = text.parse::<Quantity>().unwrap_err();
        assert!(err.to_string().contains(&format!("{text:?}")), "{err}");
    }
    assert!(matches!(
        "1x".parse::<Quantity>(),
        Err(QuantityError::UnknownSuffix { suffix, .. }) if suffix == "x"
    ));
}

#[test]
fn compares_values_not_spellings() {
    assert_eq!(q("100m"), q("0.1"));
    assert_eq!(q("1Ki"), q("1024"));
    assert!(q("1Gi") > q("1G"));
    assert!(q("-1") < q("0"));
}

#[test]
fn addition_keeps_the_first_non_zero_format() {
    let sum = Quantity::from_int(0, Format::DecimalSI)
        .checked_add(&q("3Gi"))
        .and_then(|s| s.checked_add(&q("100Mi")))
        .expect("fits");
    assert_eq!(sum.value(), 3_326_083_072);
    assert_eq!(sum.canonical(), "3172Mi");
    assert_eq!(
        q("1").checked_sub(&q("250m")).map(|d| d.milli_value()),
        Some(750)
    );
}

/// Regressions found by `cargo xtask fuzz` (target `quantity`).
#[test]
fn fuzz_regressions() {
    // 36 significant digits whose canonical form pads two zeros: it parses back.
    let first = q("136666666666666666666666666666666668E+5");
    let canonical = first.canonical();
    assert_eq!(canonical, "13666666666666666666666666666666666800e3");
    assert_eq!(q(&canonical), first);
    // A binary suffix that takes the mantissa past 36 digits is out of range, as more digits
    // are: its decimal canonical form would not parse.
    assert_eq!(
        "01001000000013333333010000000000000000000Ei".parse::<Quantity>(),
        Err(QuantityError::OutOfRange {
            text: "01001000000013333333010000000000000000000Ei".into()
        })
    );
    // A sum whose mantissa cannot grow to a multiple-of-3 exponent prints without panicking
    // (a reservation summed into allocatable's error message did).
    let big = q("999999999999999999999999999999999999")
        .checked_add(&q("0.01"))
        .unwrap();
    assert_eq!(big.canonical(), "99999999999999999999999999999999999901e-2");
}

fn suffix() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "", "n", "u", "m", "k", "M", "G", "T", "Ki", "Mi", "Gi", "Ti", "e3", "e-2", "E6",
    ])
}

proptest! {
    #[test]
    fn parse_canonical_parse_is_identity(
        int in 0u64..1_000_000_000,
        frac in prop::option::of(0u32..100_000),
        negative in any::<bool>(),
        suffix in suffix(),
    ) {
        let sign = if negative { "-" } else { "" };
        let text = match frac {
            Some(f) => format!("{sign}{int}.{f}{suffix}"),
            None => format!("{sign}{int}{suffix}"),
        };
        let first = q(&text);
        let canonical = first.canonical();
        let second = q(&canonical);
        prop_assert_eq!(first, second, "{} -> {}", text, canonical);
        prop_assert_eq!(second.canonical(), canonical);
    }
}
