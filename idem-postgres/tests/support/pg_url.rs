//! Pointing a PostgreSQL URL at another address (a fault proxy in front of the server).

/// The `host:port` of `url` (`postgres://user:pass@host:port/db?…`).
pub(crate) fn authority(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let authority = &rest[..end];
    authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host)
}

/// `url` with its `host:port` replaced by `authority`, everything else (user, password,
/// database, parameters) kept.
pub(crate) fn with_authority(url: &str, authority: &str) -> String {
    let old = self::authority(url);
    let (scheme, rest) = url.split_once("://").unwrap_or(("postgres", url));
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (head, tail) = rest.split_at(end);
    let user = head.strip_suffix(old).unwrap_or("");
    format!("{scheme}://{user}{authority}{tail}")
}

#[test]
fn authority_is_replaced_and_the_rest_kept() {
    let url = "postgres://app:secret@db.example:5433/payments?sslmode=disable";
    assert_eq!(authority(url), "db.example:5433");
    assert_eq!(
        with_authority(url, "127.0.0.1:9"),
        "postgres://app:secret@127.0.0.1:9/payments?sslmode=disable"
    );
    assert_eq!(
        with_authority("postgres://localhost:5432", "127.0.0.1:9"),
        "postgres://127.0.0.1:9"
    );
}
