//! Review of "a form that repeats a name keeps its order" (c3766d8): a form whose decoded
//! names are all distinct is still read in order by the frameworks the change cites.

use idem_tower::canonical::canonical_form;

fn canon(body: &str) -> Vec<u8> {
    canonical_form(body.as_bytes()).expect("a form")
}

/// C3: PHP and Rack read `a[]=1&a[0]=2` as `a = [2]` and `a[0]=2&a[]=1` as `a = [2, 1]`
/// (and PHP `a=1&a[]=2` as `a = [2]`, `a[]=2&a=1` as `a = "1"`): two requests. Their names
/// are distinct bytes, so both forms are sorted into one canonical form: a retry of the other
/// body under the same key replays the first's answer instead of a 422.
#[test]
fn c03_distinct_bracket_names_of_one_parameter_keep_their_order() {
    assert_ne!(canon("a[]=1&a[0]=2"), canon("a[0]=2&a[]=1"));
    assert_ne!(canon("a=1&a[]=2"), canon("a[]=2&a=1"));
}
