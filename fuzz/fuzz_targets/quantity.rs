//! Quantities: parsing, the canonical string, arithmetic and conversions never panic, and the
//! canonical string parses back to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use qoslet::policy::quantity::Quantity;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (a, b) = text.split_once(' ').unwrap_or((text, "1"));
    let Ok(qa) = a.parse::<Quantity>() else {
        return;
    };
    let canonical = qa.canonical();
    let back: Quantity = canonical
        .parse()
        .unwrap_or_else(|e| panic!("{a:?} -> {canonical:?} does not parse: {e}"));
    assert_eq!(back, qa, "{a:?} -> {canonical:?}");
    let _ = (qa.value(), qa.milli_value(), qa.scaled_value(-9), qa.signum());
    if let Ok(qb) = b.parse::<Quantity>() {
        let _ = qa.cmp(&qb);
        if let Some(s) = qa.checked_add(&qb) {
            let _ = (s.canonical(), s.value());
            if let Some(d) = s.checked_sub(&qb) {
                assert_eq!(d, qa, "({a} + {b}) - {b}");
            }
        }
    }
});
