//! Canonical JSON for fingerprints (C3).

use crate::error::{Error, Field};
use serde_json::Value;

/// Canonicalises a JSON document: object keys sorted by their UTF-8 bytes, no whitespace,
/// strings re-escaped the one way serde_json writes them, numbers as parsed. Fields named in
/// `exclude` are removed first.
///
/// An exclusion is a JSON Pointer (RFC 6901, `"/metadata/sent_at"`, `"/items/0/note"`); a
/// name without a leading `/` is a top-level field (`"sent_at"` = `"/sent_at"`). Excluding a
/// path that is not there is not an error. Numbers keep their form: `1` and `1.0` differ.
/// Numbers are read as serde_json reads them (integers within 64 bits exactly, others as an
/// IEEE double), so two spellings of one double (`0.1` and `0.10000000000000001`) are the same
/// request; send amounts as integers (minor units) or strings when that matters.
///
/// A body that is not JSON is [`Error::InvalidInput`] on [`Field::Body`].
///
/// ```
/// use idem_core::canonical_json;
/// let out = canonical_json(br#"{ "b": [1, {"y":1,"x":2}], "a": "\u00e9", "t": 9 }"#, &["t"])?;
/// assert_eq!(out, "{\"a\":\"é\",\"b\":[1,{\"x\":2,\"y\":1}]}".as_bytes());
/// # Ok::<(), idem_core::Error>(())
/// ```
pub fn canonical_json(body: &[u8], exclude: &[&str]) -> Result<Vec<u8>, Error> {
    let mut value: Value = serde_json::from_slice(body)
        .map_err(|e| Error::invalid(Field::Body, format!("not JSON: {e}")))?;
    for path in exclude {
        remove_path(&mut value, path);
    }
    let mut out = Vec::with_capacity(body.len());
    write_canonical(&value, &mut out)?;
    Ok(out)
}

fn remove_path(value: &mut Value, path: &str) {
    let pointer = if path.starts_with('/') {
        path.to_owned()
    } else {
        format!("/{}", path.replace('~', "~0").replace('/', "~1"))
    };
    let Some((parent, last)) = pointer.rsplit_once('/') else {
        return;
    };
    let last = last.replace("~1", "/").replace("~0", "~");
    match value.pointer_mut(parent) {
        Some(Value::Object(map)) => {
            map.remove(&last);
        }
        Some(Value::Array(items)) => {
            if let Ok(index) = last.parse::<usize>() {
                if index < items.len() {
                    items.remove(index);
                }
            }
        }
        _ => {}
    }
}

/// Writes keys in sorted order explicitly, so the result does not depend on whether some
/// other crate turned on serde_json's `preserve_order`.
fn write_canonical(value: &Value, out: &mut Vec<u8>) -> Result<(), Error> {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push(b'{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_scalar(&Value::String(key.clone()), out)?;
                out.push(b':');
                write_canonical(item, out)?;
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out)?;
            }
            out.push(b']');
        }
        scalar => write_scalar(scalar, out)?,
    }
    Ok(())
}

fn write_scalar(value: &Value, out: &mut Vec<u8>) -> Result<(), Error> {
    serde_json::to_writer(out, value).map_err(|e| Error::invalid(Field::Body, e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(s: &str, exclude: &[&str]) -> String {
        String::from_utf8(canonical_json(s.as_bytes(), exclude).expect("valid json")).expect("utf8")
    }

    #[test]
    fn c03_key_order_and_whitespace_do_not_matter() {
        assert_eq!(
            canon(r#"{"b":1,"a":{"d":[1, 2],"c":null}}"#, &[]),
            canon("{ \"a\" : {\"c\":null,\n\"d\":[1,2]}, \"b\":1 }", &[])
        );
    }

    #[test]
    fn c03_excludes_top_level_nested_and_array_paths() {
        assert_eq!(canon(r#"{"a":1,"ts":2}"#, &["ts"]), r#"{"a":1}"#);
        assert_eq!(
            canon(r#"{"a":{"ts":2,"k":1}}"#, &["/a/ts"]),
            r#"{"a":{"k":1}}"#
        );
        assert_eq!(canon(r#"{"l":[1,2,3]}"#, &["/l/1"]), r#"{"l":[1,3]}"#);
        assert_eq!(canon(r#"{"a/b":1,"c":2}"#, &["a/b"]), r#"{"c":2}"#);
        assert_eq!(
            canon(r#"{"a":1}"#, &["/missing/deep", "/a/x", "/"]),
            r#"{"a":1}"#
        );
    }

    #[test]
    fn c03_values_still_count() {
        assert_ne!(canon(r#"{"a":1}"#, &[]), canon(r#"{"a":2}"#, &[]));
        assert_ne!(canon(r#"[1,2]"#, &[]), canon(r#"[2,1]"#, &[]));
    }

    #[test]
    fn c12_invalid_or_hostile_json_is_a_typed_error() {
        assert!(canonical_json(b"{not json", &[]).is_err());
        let deep = "[".repeat(10_000) + &"]".repeat(10_000);
        assert!(canonical_json(deep.as_bytes(), &[]).is_err());
    }
}
