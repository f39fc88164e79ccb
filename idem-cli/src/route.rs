//! Telling a route template from a concrete path, for the hint `inspect` gives when it finds
//! nothing: records are stored under the route the application names (under axum, the matched
//! template such as `POST /v1/customers/{id}/refunds`), never the path a client sent.

/// The first segment of `route`'s path that looks like an id rather than a template's part:
/// all digits (`42`), a UUID, a prefixed id (`ch_3MmlLrLkdIwHu7ix`, `cus_9s6XKzkNRiz8i3`), or a
/// long hex or base-62 token with digits in it. `None` when every segment could be a
/// template's.
pub(crate) fn looks_concrete(route: &str) -> Option<&str> {
    let path = route.split_once(' ').map_or(route, |(_, path)| path);
    let path = path.split(['?', '#']).next().unwrap_or(path);
    path.split('/').find(|segment| is_id(segment))
}

fn is_id(segment: &str) -> bool {
    if segment.is_empty() || segment.contains(['{', '}', ':', '*', '<', '>']) {
        return false;
    }
    let digits = segment.bytes().filter(u8::is_ascii_digit).count();
    let all_digits = digits == segment.len();
    let alnum = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric());
    let prefixed = segment.split_once('_').is_some_and(|(prefix, rest)| {
        (1..=8).contains(&prefix.len())
            && prefix.bytes().all(|b| b.is_ascii_lowercase())
            && rest.len() >= 6
            && alnum(rest)
            && rest
                .bytes()
                .any(|b| b.is_ascii_digit() || b.is_ascii_uppercase())
    });
    let token = segment.len() >= 16 && digits > 0 && alnum(segment);
    all_digits || is_uuid(segment) || prefixed || token
}

fn is_uuid(segment: &str) -> bool {
    let groups: Vec<&str> = segment.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, len)| g.len() == len && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_are_not_concrete() {
        for route in [
            "POST /v1/charges",
            "POST /v1/customers/{id}/refunds",
            "POST /v1/customers/:id/refunds",
            "POST /v2/payment_intents/{intent}/confirm",
            "GET /",
            "POST /v1/charges/*rest",
        ] {
            assert_eq!(looks_concrete(route), None, "{route}");
        }
    }

    #[test]
    fn ids_in_a_path_are_found() {
        for (route, id) in [
            ("POST /v1/customers/42/refunds", "42"),
            (
                "POST /v1/orders/8e03978e-40d5-43e8-bc93-6894a57f9324/pay",
                "8e03978e-40d5-43e8-bc93-6894a57f9324",
            ),
            (
                "POST /v1/charges/ch_3MmlLrLkdIwHu7ix/refund",
                "ch_3MmlLrLkdIwHu7ix",
            ),
            (
                "POST /v1/customers/cus_9s6XKzkNRiz8i3/refunds",
                "cus_9s6XKzkNRiz8i3",
            ),
            ("POST /files/a1b2c3d4e5f6a7b8c9d0", "a1b2c3d4e5f6a7b8c9d0"),
            ("/v1/customers/7?expand=x", "7"),
        ] {
            assert_eq!(looks_concrete(route), Some(id), "{route}");
        }
    }
}
