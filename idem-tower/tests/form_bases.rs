//! C3 on forms whose decoded names are all distinct bytes but share a base (the parameter
//! before the first `[`): Rack and PHP read them in order, so the canonical form keeps it.

use idem_tower::canonical::canonical_form;

fn canon(body: &str) -> Vec<u8> {
    canonical_form(body.as_bytes()).expect("a form")
}

/// C3: PHP and Rack read `a[]=1&a[0]=2` as `a = [2]` and `a[0]=2&a[]=1` as `a = [2, 1]`
/// (and PHP `a=1&a[]=2` as `a = [2]`, `a[]=2&a=1` as `a = "1"`): two requests, never one
/// canonical form, so a retry of the other body under the same key is a 422, not a replay.
#[test]
fn c03_distinct_bracket_names_of_one_parameter_keep_their_order() {
    assert_ne!(canon("a[]=1&a[0]=2"), canon("a[0]=2&a[]=1"));
    assert_ne!(canon("a=1&a[]=2"), canon("a[]=2&a=1"));
}

/// C3: PHP mangles a name before it takes its base: leading spaces are dropped, and `.` and
/// ` ` (and an unmatched `[`) become `_` (`php_register_variable_ex`). So PHP reads
/// `a.b=1&a_b=2` as `a_b = "2"` and `a_b=2&a.b=1` as `a_b = "1"`, and `+a=1&a=2` as `a = "2"`
/// and `a=2&+a=1` as `a = "1"`: two requests each time. Their bases differ as bytes, so both
/// were sorted into one canonical form, and a retry of the other body under the first one's key
/// would replay the first one's answer instead of a 422.
#[test]
fn c03_names_php_reads_as_one_parameter_keep_their_order() {
    assert_ne!(canon("a.b=1&a_b=2"), canon("a_b=2&a.b=1"), "dot");
    assert_ne!(canon("a+b=1&a_b=2"), canon("a_b=2&a+b=1"), "space");
    assert_ne!(canon("+a=1&a=2"), canon("a=2&+a=1"), "leading space");
    assert_ne!(canon("a[b=1&a_b=2"), canon("a_b=2&a[b=1"), "unmatched [");
    // Distinct plain names are still a map.
    assert_eq!(canon("b=2&a_c=1"), canon("a_c=1&b=2"));
}

/// C3: Rack 2 (`Rack::QueryParser#normalize_params`, still under Rails 6 and 7.0) takes a
/// name's key as its first run of characters other than `[` and `]`, brackets before it
/// dropped: `a]`, `[a` and `a` are all `a`. So it reads `a]=1&a=2` as `a = "2"` and
/// `a=2&a]=1` as `a = "1"`: two requests, never one canonical form.
#[test]
fn c03_names_rack_2_reads_as_one_parameter_keep_their_order() {
    assert_ne!(canon("a%5D=1&a=2"), canon("a=2&a%5D=1"), "a]");
    assert_ne!(canon("%5Ba=1&a=2"), canon("a=2&%5Ba=1"), "[a");
}

/// C3: ASP.NET Core reads a form's names without regard to ASCII case (`FormCollection`,
/// `StringComparer.OrdinalIgnoreCase`) and binds a scalar to the first value: it reads
/// `Amount=100&amount=1` as `amount = "100"` and `amount=1&Amount=100` as `amount = "1"`. Both
/// names are plain and distinct as bytes, so both were sorted into one canonical form, and a
/// retry of the other body under the first one's key replayed the first one's answer.
#[test]
fn c03_names_equal_but_for_case_keep_their_order() {
    assert_ne!(
        canon("Amount=100&amount=1"),
        canon("amount=1&Amount=100"),
        "ASCII case"
    );
    // Distinct plain names are still a map.
    assert_eq!(
        canon("Amount=100&currency=eur"),
        canon("currency=eur&Amount=100")
    );
}
