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
