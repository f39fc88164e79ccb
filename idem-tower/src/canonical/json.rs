//! Canonical JSON: one JSON body, one byte string (C3).
//!
//! A small strict RFC 8259 parser and a canonical writer, written by hand so that the canonical
//! form depends on nothing but this file: no number type, no Cargo feature of any other crate
//! (such as `arbitrary_precision` or `preserve_order` elsewhere in the build) can change it.
//! The parser reads the whole body once into a small tree whose numbers are slices of the
//! input and whose strings borrow from it unless they contain escapes; objects are sorted and
//! checked for duplicate keys as they close; exclusions are then removed from the tree and the
//! tree is written out. Nesting is limited to [`MAX_DEPTH`], so recursion is bounded.

use std::borrow::Cow;

use idem_core::{Error, Field};

/// The deepest nesting of arrays and objects accepted (the outermost one is level 1).
const MAX_DEPTH: usize = 128;

/// Canonicalises a JSON body for fingerprinting (C3), so that one request always gives the
/// same bytes whatever key order, whitespace or string escaping the client used.
///
/// The body must be one strict RFC 8259 value in UTF-8: no byte order mark, comments,
/// trailing commas, single quotes, `NaN`, leading zeros or `+` signs, no unescaped control
/// characters in strings, no unpaired UTF-16 surrogates in `\u` escapes, and whitespace only
/// space, tab, LF and CR. An object with a repeated key is rejected (keys are compared after
/// unescaping, so `"a"` and `"\u0061"` are the same key), and so is nesting deeper than 128
/// arrays and objects.
///
/// The output has no whitespace, object keys sorted by the bytes of their UTF-8 form, arrays
/// in their order, `true`/`false`/`null` as they are, and strings in one escaping: `\"`, `\\`,
/// `\b \f \n \r \t`, other control characters as `\u00XX` in lowercase hex, everything else
/// (`/`, DEL, all non-ASCII) as raw UTF-8; so `"\u00e9"` and `"é"`, or `"\/"` and `"/"`, are
/// the same. Numbers are kept exactly as written, digit for digit, never read into a float or
/// a 64-bit integer, so amounts of any size or precision stay distinct; the only changes are
/// `E` to `e` and dropping a `+` after it (`1E+2` becomes `1e2`). Otherwise their form counts:
/// `1`, `1.0` and `1e0` are different requests, and so are `100` and `1e2`; `-0` stays `-0`.
/// Clients should send amounts as integers in minor units, or as strings.
///
/// Each entry of `exclude` removes one part of the document before it is written. It is an
/// RFC 6901 JSON Pointer (`"/metadata/sent_at"`, `"/items/0/note"`, with `~1` for `/` and `~0`
/// for `~` in a token; `"/"` names the top-level key `""`), or a bare name without a leading
/// `/`, taken literally as a top-level field (`"sent_at"` is `"/sent_at"`, and `"a/b"` is the
/// field named `a/b`). An array index removes that element and the later ones shift; entries
/// apply in the order given. A path that is not there, or a pointer with an invalid `~`
/// escape, removes nothing and is not an error. The pointer `""` would be the whole document,
/// which cannot be excluded: it is ignored. Duplicate keys are checked on the body as
/// received, before anything is excluded.
///
/// Every failure is [`Error::InvalidInput`] on [`Field::Body`], with a short reason that says
/// what is wrong and at which byte offset, and never quotes the body.
///
/// ```
/// use idem_tower::canonical::canonical_json;
/// let out = canonical_json(br#"{ "b": [1, {"y":1,"x":2}], "a": "\u00e9", "t": 9 }"#, &["t"])?;
/// assert_eq!(out, "{\"a\":\"é\",\"b\":[1,{\"x\":2,\"y\":1}]}".as_bytes());
/// assert_ne!(canonical_json(b"18446744073709551616", &[])?, canonical_json(b"18446744073709551617", &[])?);
/// assert!(canonical_json(br#"{"amount":1,"amount":2}"#, &[]).is_err());
/// # Ok::<(), idem_core::Error>(())
/// ```
pub fn canonical_json(body: &[u8], exclude: &[&str]) -> Result<Vec<u8>, Error> {
    if body.starts_with(b"\xEF\xBB\xBF") {
        return Err(syntax(0, "byte order mark"));
    }
    let text = std::str::from_utf8(body).map_err(|e| syntax(e.valid_up_to(), "invalid UTF-8"))?;
    let mut root = Parser { text, pos: 0 }.document()?;
    for path in exclude {
        remove_path(&mut root, path);
    }
    let mut out = Vec::with_capacity(body.len());
    write_node(&root, &mut out);
    Ok(out)
}

/// A parsed value. Numbers are their literal text (already validated), strings unescaped.
enum Node<'a> {
    Null,
    Bool(bool),
    Number(&'a str),
    String(Cow<'a, str>),
    Array(Vec<Node<'a>>),
    /// Sorted by key bytes, keys unique.
    Object(Vec<Member<'a>>),
}

struct Member<'a> {
    key: Cow<'a, str>,
    /// Byte offset of the key in the body, for the duplicate-key error.
    at: usize,
    value: Node<'a>,
}

fn syntax(at: usize, what: &str) -> Error {
    Error::invalid(Field::Body, format!("not JSON: {what} at byte {at}"))
}

struct Parser<'a> {
    /// The whole body, already checked to be UTF-8.
    text: &'a str,
    pos: usize,
}

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.pos).copied()
    }

    fn peek_at(&self, ahead: usize) -> Option<u8> {
        self.text
            .as_bytes()
            .get(self.pos.saturating_add(ahead))
            .copied()
    }

    fn err(&self, what: &str) -> Error {
        syntax(self.pos, what)
    }

    /// The input between two offsets; both always lie on ASCII bytes, so on char boundaries.
    fn slice(&self, start: usize, end: usize) -> Result<&'a str, Error> {
        self.text
            .get(start..end)
            .ok_or_else(|| syntax(start, "internal error: slice off a character boundary"))
    }

    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }

    fn document(&mut self) -> Result<Node<'a>, Error> {
        self.skip_ws();
        if self.peek().is_none() {
            return Err(self.err("expected a value, found the end"));
        }
        let root = self.value(0)?;
        self.skip_ws();
        if self.peek().is_some() {
            return Err(self.err("unexpected data after the value"));
        }
        Ok(root)
    }

    /// `depth` is the number of arrays and objects around this value.
    fn value(&mut self, depth: usize) -> Result<Node<'a>, Error> {
        match self.peek() {
            None => Err(self.err("unexpected end, expected a value")),
            Some(b'{') => self.object(depth + 1),
            Some(b'[') => self.array(depth + 1),
            Some(b'"') => Ok(Node::String(self.string()?)),
            Some(b't') => self.literal("true", Node::Bool(true)),
            Some(b'f') => self.literal("false", Node::Bool(false)),
            Some(b'n') => self.literal("null", Node::Null),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(b'+') => Err(self.err("a number cannot start with '+'")),
            Some(b'.') => Err(self.err("a number cannot start with '.'")),
            Some(b'\'') => Err(self.err("strings need double quotes")),
            Some(b'/') => Err(self.err("comments are not allowed")),
            Some(_) => Err(self.err("expected a value")),
        }
    }

    fn literal(&mut self, word: &str, node: Node<'a>) -> Result<Node<'a>, Error> {
        let rest = self.text.as_bytes().get(self.pos..).unwrap_or_default();
        if rest.starts_with(word.as_bytes()) {
            self.pos += word.len();
            Ok(node)
        } else {
            Err(self.err("invalid literal"))
        }
    }

    fn digits(&mut self) {
        while let Some(b'0'..=b'9') = self.peek() {
            self.pos += 1;
        }
    }

    /// `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`, kept as text.
    fn number(&mut self) -> Result<Node<'a>, Error> {
        let start = self.pos;
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        match self.peek() {
            Some(b'0') => {
                self.pos += 1;
                if let Some(b'0'..=b'9') = self.peek() {
                    return Err(self.err("leading zero in number"));
                }
            }
            Some(b'1'..=b'9') => self.digits(),
            _ => return Err(self.err("expected a digit")),
        }
        if self.peek() == Some(b'.') {
            self.pos += 1;
            if !matches!(self.peek(), Some(b'0'..=b'9')) {
                return Err(self.err("expected a digit after the decimal point"));
            }
            self.digits();
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.pos += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.pos += 1;
            }
            if !matches!(self.peek(), Some(b'0'..=b'9')) {
                return Err(self.err("expected a digit in the exponent"));
            }
            self.digits();
        }
        Ok(Node::Number(self.slice(start, self.pos)?))
    }

    fn array(&mut self, depth: usize) -> Result<Node<'a>, Error> {
        if depth > MAX_DEPTH {
            return Err(self.err("nesting deeper than 128 levels"));
        }
        self.pos += 1; // '['
        let mut items = Vec::new();
        self.skip_ws();
        if self.peek() == Some(b']') {
            self.pos += 1;
            return Ok(Node::Array(items));
        }
        loop {
            self.skip_ws();
            items.push(self.value(depth)?);
            self.skip_ws();
            match self.peek() {
                Some(b',') => {
                    self.pos += 1;
                    self.skip_ws();
                    if self.peek() == Some(b']') {
                        return Err(self.err("trailing comma in array"));
                    }
                }
                Some(b']') => {
                    self.pos += 1;
                    return Ok(Node::Array(items));
                }
                None => return Err(self.err("unexpected end inside an array")),
                Some(_) => return Err(self.err("expected ',' or ']' in array")),
            }
        }
    }

    fn object(&mut self, depth: usize) -> Result<Node<'a>, Error> {
        if depth > MAX_DEPTH {
            return Err(self.err("nesting deeper than 128 levels"));
        }
        self.pos += 1; // '{'
        let mut members = Vec::new();
        self.skip_ws();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Ok(Node::Object(members));
        }
        loop {
            self.skip_ws();
            match self.peek() {
                Some(b'"') => {}
                Some(b'}') => return Err(self.err("trailing comma in object")),
                None => return Err(self.err("unexpected end inside an object")),
                Some(b'\'') => return Err(self.err("strings need double quotes")),
                Some(_) => return Err(self.err("expected a string as object key")),
            }
            let at = self.pos;
            let key = self.string()?;
            self.skip_ws();
            if self.peek() != Some(b':') {
                return Err(self.err("expected ':' after object key"));
            }
            self.pos += 1;
            self.skip_ws();
            let value = self.value(depth)?;
            members.push(Member { key, at, value });
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b'}') => {
                    self.pos += 1;
                    break;
                }
                None => return Err(self.err("unexpected end inside an object")),
                Some(_) => return Err(self.err("expected ',' or '}' in object")),
            }
        }
        members.sort_unstable_by(|a, b| a.key.as_bytes().cmp(b.key.as_bytes()));
        for pair in members.windows(2) {
            if let [a, b] = pair {
                if a.key == b.key {
                    return Err(Error::invalid(
                        Field::Body,
                        format!("duplicate object key at byte {}", a.at.max(b.at)),
                    ));
                }
            }
        }
        Ok(Node::Object(members))
    }

    /// A string starting at the current `"`; borrowed from the body when it has no escapes.
    fn string(&mut self) -> Result<Cow<'a, str>, Error> {
        let open = self.pos;
        self.pos += 1;
        let mut owned: Option<String> = None;
        let mut run = self.pos;
        loop {
            let Some(byte) = self.peek() else {
                return Err(syntax(open, "unterminated string starting"));
            };
            match byte {
                b'"' => {
                    let tail = self.slice(run, self.pos)?;
                    self.pos += 1;
                    return Ok(match owned {
                        None => Cow::Borrowed(tail),
                        Some(mut s) => {
                            s.push_str(tail);
                            Cow::Owned(s)
                        }
                    });
                }
                b'\\' => {
                    let chunk = self.slice(run, self.pos)?;
                    let s = owned.get_or_insert_with(String::new);
                    s.push_str(chunk);
                    self.escape(s)?;
                    run = self.pos;
                }
                0x00..=0x1F => return Err(self.err("unescaped control character in string")),
                _ => self.pos += 1,
            }
        }
    }

    /// One escape starting at the current `\`, appended to `out`.
    fn escape(&mut self, out: &mut String) -> Result<(), Error> {
        let at = self.pos;
        let Some(kind) = self.peek_at(1) else {
            return Err(self.err("unterminated escape"));
        };
        self.pos += 2;
        let ch = match kind {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let first = self.hex4(at)?;
                let code = match first {
                    0xD800..=0xDBFF => {
                        let low_at = self.pos;
                        if self.peek() != Some(b'\\') || self.peek_at(1) != Some(b'u') {
                            return Err(syntax(
                                at,
                                "high surrogate escape not followed by a low one",
                            ));
                        }
                        self.pos += 2;
                        let second = self.hex4(low_at)?;
                        if !(0xDC00..=0xDFFF).contains(&second) {
                            return Err(syntax(low_at, "expected a low surrogate escape"));
                        }
                        0x10000 + ((first - 0xD800) << 10) + (second - 0xDC00)
                    }
                    0xDC00..=0xDFFF => {
                        return Err(syntax(at, "low surrogate escape without a high one"))
                    }
                    _ => first,
                };
                char::from_u32(code).ok_or_else(|| syntax(at, "invalid \\u escape"))?
            }
            _ => return Err(syntax(at, "invalid escape")),
        };
        out.push(ch);
        Ok(())
    }

    /// Four hex digits (either case) at the current position, for the `\u` escape at `at`.
    fn hex4(&mut self, at: usize) -> Result<u32, Error> {
        let mut code = 0u32;
        for _ in 0..4 {
            let digit = match self.peek() {
                Some(b @ b'0'..=b'9') => b - b'0',
                Some(b @ b'a'..=b'f') => b - b'a' + 10,
                Some(b @ b'A'..=b'F') => b - b'A' + 10,
                _ => return Err(syntax(at, "invalid \\u escape")),
            };
            code = code * 16 + u32::from(digit);
            self.pos += 1;
        }
        Ok(code)
    }
}

/// Removes what `path` names, if it is there (see [`canonical_json`] for the syntax).
fn remove_path(root: &mut Node<'_>, path: &str) {
    let tokens: Vec<Cow<'_, str>> = match path.strip_prefix('/') {
        Some(rest) => match rest.split('/').map(unescape_token).collect::<Option<_>>() {
            Some(tokens) => tokens,
            None => return, // invalid `~` escape: names nothing
        },
        None if path.is_empty() => return, // the whole document: not allowed, ignored
        None => vec![Cow::Borrowed(path)],
    };
    let Some((last, parents)) = tokens.split_last() else {
        return;
    };
    let mut node = root;
    for token in parents {
        node = match node {
            Node::Object(members) => match find_member(members, token) {
                Some(i) => match members.get_mut(i) {
                    Some(member) => &mut member.value,
                    None => return,
                },
                None => return,
            },
            Node::Array(items) => match array_index(token).and_then(|i| items.get_mut(i)) {
                Some(item) => item,
                None => return,
            },
            _ => return,
        };
    }
    match node {
        Node::Object(members) => {
            if let Some(i) = find_member(members, last) {
                members.remove(i);
            }
        }
        Node::Array(items) => {
            if let Some(i) = array_index(last) {
                if i < items.len() {
                    items.remove(i);
                }
            }
        }
        _ => {}
    }
}

/// Members are sorted by key bytes with unique keys, so a binary search finds the one.
fn find_member(members: &[Member<'_>], key: &str) -> Option<usize> {
    members
        .binary_search_by(|m| m.key.as_bytes().cmp(key.as_bytes()))
        .ok()
}

/// An RFC 6901 array index: `0` or digits without a leading zero (`-` and others name nothing).
fn array_index(token: &str) -> Option<usize> {
    let bytes = token.as_bytes();
    match bytes {
        [b'0'] => Some(0),
        [b'1'..=b'9', rest @ ..] if rest.iter().all(u8::is_ascii_digit) => token.parse().ok(),
        _ => None,
    }
}

/// Decodes `~1` to `/` and `~0` to `~`; any other `~` makes the token invalid.
fn unescape_token(token: &str) -> Option<Cow<'_, str>> {
    if !token.contains('~') {
        return Some(Cow::Borrowed(token));
    }
    let mut out = String::with_capacity(token.len());
    let mut chars = token.chars();
    while let Some(c) = chars.next() {
        if c == '~' {
            match chars.next() {
                Some('0') => out.push('~'),
                Some('1') => out.push('/'),
                _ => return None,
            }
        } else {
            out.push(c);
        }
    }
    Some(Cow::Owned(out))
}

/// Writes the canonical form; recursion is bounded by the parser's nesting limit.
fn write_node(node: &Node<'_>, out: &mut Vec<u8>) {
    match node {
        Node::Null => out.extend_from_slice(b"null"),
        Node::Bool(true) => out.extend_from_slice(b"true"),
        Node::Bool(false) => out.extend_from_slice(b"false"),
        Node::Number(text) => {
            for &b in text.as_bytes() {
                match b {
                    b'E' => out.push(b'e'),
                    // A validated number has a `+` only right after its exponent marker.
                    b'+' => {}
                    _ => out.push(b),
                }
            }
        }
        Node::String(s) => write_string(s, out),
        Node::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_node(item, out);
            }
            out.push(b']');
        }
        Node::Object(members) => {
            out.push(b'{');
            for (i, member) in members.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(&member.key, out);
                out.push(b':');
                write_node(&member.value, out);
            }
            out.push(b'}');
        }
    }
}

fn write_string(s: &str, out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut run = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let short: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            0x08 => b"\\b",
            0x0C => b"\\f",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x00..=0x1F => b"",
            _ => continue,
        };
        out.extend_from_slice(bytes.get(run..i).unwrap_or_default());
        if short.is_empty() {
            out.extend_from_slice(b"\\u00");
            out.push(HEX[usize::from(b >> 4)]);
            out.push(HEX[usize::from(b & 0xF)]);
        } else {
            out.extend_from_slice(short);
        }
        run = i + 1;
    }
    out.extend_from_slice(bytes.get(run..).unwrap_or_default());
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn canon(s: &str, exclude: &[&str]) -> String {
        let out = canonical_json(s.as_bytes(), exclude)
            .unwrap_or_else(|e| panic!("{s:?} should be accepted: {e}"));
        String::from_utf8(out).unwrap_or_else(|e| panic!("output is not UTF-8: {e}"))
    }

    fn canon_bytes(b: &[u8]) -> Vec<u8> {
        canonical_json(b, &[]).unwrap_or_else(|e| panic!("{b:?} should be accepted: {e}"))
    }

    /// The reason of a rejection, after checking it is `InvalidInput` on `Field::Body`.
    fn rejected(body: &[u8]) -> String {
        match canonical_json(body, &[]) {
            Err(Error::InvalidInput {
                field: Field::Body,
                reason,
            }) => reason,
            Err(other) => panic!("wrong error for {body:?}: {other:?}"),
            Ok(out) => panic!(
                "{:?} should be rejected, got {:?}",
                String::from_utf8_lossy(body),
                String::from_utf8_lossy(&out)
            ),
        }
    }

    fn nested_arrays(depth: usize) -> String {
        "[".repeat(depth) + &"]".repeat(depth)
    }

    fn nested_objects(depth: usize) -> String {
        r#"{"a":"#.repeat(depth) + "1" + &"}".repeat(depth)
    }

    // ---- C3: what is normalised ----

    #[test]
    fn c03_key_order_and_whitespace_do_not_matter() {
        assert_eq!(
            canon(r#"{"b":1,"a":{"d":[1, 2],"c":null}}"#, &[]),
            canon(
                " \t{ \"a\" : {\"c\":null,\r\n\"d\":[1,2]}, \"b\":1 }\n",
                &[]
            )
        );
        assert_eq!(
            canon(r#"{"b":1,"a":{"d":[1, 2],"c":null}}"#, &[]),
            r#"{"a":{"c":null,"d":[1,2]},"b":1}"#
        );
    }

    #[test]
    fn c03_keys_sort_by_utf8_bytes() {
        // Byte order, not UTF-16 order: U+FF61 (EF BD A1) sorts before U+1F600 (F0 9F 98 80),
        // uppercase before lowercase, shorter prefix first.
        assert_eq!(
            canon(r#"{"😀":1,"｡":2,"b":3,"B":4,"ab":5,"a":6,"":7}"#, &[]),
            r#"{"":7,"B":4,"a":6,"ab":5,"b":3,"｡":2,"😀":1}"#
        );
    }

    #[test]
    fn c03_values_and_array_order_still_count() {
        assert_ne!(canon(r#"{"a":1}"#, &[]), canon(r#"{"a":2}"#, &[]));
        assert_ne!(canon(r#"[1,2]"#, &[]), canon(r#"[2,1]"#, &[]));
        assert_ne!(canon(r#"{"a":"1"}"#, &[]), canon(r#"{"a":1}"#, &[]));
    }

    #[test]
    fn c03_literals_and_scalars_at_top_level() {
        assert_eq!(canon(" true ", &[]), "true");
        assert_eq!(canon("false", &[]), "false");
        assert_eq!(canon("null", &[]), "null");
        assert_eq!(canon(r#""x""#, &[]), r#""x""#);
        assert_eq!(canon("[ ]", &[]), "[]");
        assert_eq!(canon("{ }", &[]), "{}");
    }

    // ---- C3: exclusions ----

    #[test]
    fn c03_exclude_top_level_field_by_name_or_pointer() {
        assert_eq!(canon(r#"{"a":1,"ts":2}"#, &["ts"]), r#"{"a":1}"#);
        assert_eq!(canon(r#"{"a":1,"ts":2}"#, &["/ts"]), r#"{"a":1}"#);
    }

    #[test]
    fn c03_exclude_nested_field() {
        assert_eq!(
            canon(r#"{"a":{"ts":2,"k":1},"ts":3}"#, &["/a/ts"]),
            r#"{"a":{"k":1},"ts":3}"#
        );
        assert_eq!(
            canon(
                r#"{"items":[{"sku":"x","note":"hi"},{"note":"yo"}]}"#,
                &["/items/0/note"]
            ),
            r#"{"items":[{"sku":"x"},{"note":"yo"}]}"#
        );
    }

    #[test]
    fn c03_exclude_array_index_shifts_later_elements() {
        assert_eq!(canon(r#"{"l":[1,2,3]}"#, &["/l/1"]), r#"{"l":[1,3]}"#);
        // Entries apply in order: after removing index 0, the old index 1 is index 0.
        assert_eq!(canon(r#"{"l":[1,2,3]}"#, &["/l/0", "/l/0"]), r#"{"l":[3]}"#);
        assert_eq!(canon(r#"[1,2,3]"#, &["/2"]), "[1,2]");
    }

    #[test]
    fn c03_exclude_invalid_array_indices_remove_nothing() {
        let doc = r#"{"l":[1,2,3]}"#;
        for path in [
            "/l/3",
            "/l/-",
            "/l/01",
            "/l/+1",
            "/l/x",
            "/l/",
            "/l/99999999999999999999999",
        ] {
            assert_eq!(canon(doc, &[path]), r#"{"l":[1,2,3]}"#, "{path}");
        }
    }

    #[test]
    fn c03_exclude_escaped_pointer_tokens() {
        assert_eq!(canon(r#"{"a/b":1,"c":2}"#, &["/a~1b"]), r#"{"c":2}"#);
        assert_eq!(canon(r#"{"m~n":1,"c":2}"#, &["/m~0n"]), r#"{"c":2}"#);
        // `~01` is `~1` (decode `~0` once, never twice).
        assert_eq!(canon(r#"{"~1":1,"/":2}"#, &["/~01"]), r#"{"/":2}"#);
        assert_eq!(
            canon(r#"{"x":{"a/b":{"~":1,"k":2}}}"#, &["/x/a~1b/~0"]),
            r#"{"x":{"a/b":{"k":2}}}"#
        );
        // Keys are matched in their unescaped form.
        assert_eq!(canon(r#"{"\u00e9":1,"c":2}"#, &["/é"]), r#"{"c":2}"#);
    }

    #[test]
    fn c03_exclude_bare_name_is_taken_literally() {
        assert_eq!(
            canon(r#"{"a/b":1,"a":{"b":2}}"#, &["a/b"]),
            r#"{"a":{"b":2}}"#
        );
        assert_eq!(canon(r#"{"a~1b":1,"a/b":2}"#, &["a~1b"]), r#"{"a/b":2}"#);
    }

    #[test]
    fn c03_exclude_missing_paths_is_not_an_error() {
        assert_eq!(
            canon(
                r#"{"a":1,"s":"x"}"#,
                &["/missing/deep", "/a/x", "/s/0", "nope", "/a~2"]
            ),
            r#"{"a":1,"s":"x"}"#
        );
        assert_eq!(canon("[1]", &["a", "/a"]), "[1]");
        assert_eq!(canon("7", &["/a", "/0"]), "7");
    }

    #[test]
    fn c03_exclude_slash_is_the_empty_key_and_empty_pointer_is_ignored() {
        assert_eq!(canon(r#"{"":1,"a":2}"#, &["/"]), r#"{"a":2}"#);
        assert_eq!(canon(r#"{"":1,"a":2}"#, &[""]), r#"{"":1,"a":2}"#);
        assert_eq!(canon(r#"{"a":{"":1,"b":2}}"#, &["/a/"]), r#"{"a":{"b":2}}"#);
    }

    #[test]
    fn c03_exclude_does_not_hide_duplicate_keys() {
        let reason = match canonical_json(br#"{"t":1,"t":2,"a":0}"#, &["t"]) {
            Err(Error::InvalidInput { reason, .. }) => reason,
            other => panic!("expected a rejection, got {other:?}"),
        };
        assert!(reason.contains("duplicate"), "{reason}");
    }

    // ---- C3: numbers ----

    #[test]
    fn c03_big_integers_differing_in_last_digit_differ() {
        assert_eq!(canon("18446744073709551616", &[]), "18446744073709551616");
        assert_ne!(
            canon("18446744073709551616", &[]),
            canon("18446744073709551617", &[])
        );
        let a = format!(r#"{{"amount":{}1}}"#, "9".repeat(400));
        let b = format!(r#"{{"amount":{}2}}"#, "9".repeat(400));
        assert_ne!(canon(&a, &[]), canon(&b, &[]));
        assert_eq!(canon(&a, &[]), a);
        assert_ne!(
            canon("-9223372036854775809", &[]),
            canon("-9223372036854775808", &[])
        );
    }

    #[test]
    fn c03_long_decimals_differing_in_last_digit_differ() {
        assert_eq!(canon("1234567890123456.78", &[]), "1234567890123456.78");
        assert_ne!(
            canon("1234567890123456.78", &[]),
            canon("1234567890123456.77", &[])
        );
        assert_ne!(canon("0.1", &[]), canon("0.10000000000000001", &[]));
        assert_ne!(canon("1e400", &[]), canon("1e401", &[]));
    }

    #[test]
    fn c03_numbers_keep_their_written_form() {
        assert_eq!(
            canon("[1,1.0,1e0,100,1e2,-0,0.0,-0.0]", &[]),
            "[1,1.0,1e0,100,1e2,-0,0.0,-0.0]"
        );
        assert_ne!(canon("1", &[]), canon("1.0", &[]));
        assert_ne!(canon("100", &[]), canon("1e2", &[]));
        assert_ne!(canon("0", &[]), canon("-0", &[]));
    }

    #[test]
    fn c03_exponent_marker_and_plus_are_normalised() {
        assert_eq!(canon("1E+2", &[]), "1e2");
        assert_eq!(canon("1e+2", &[]), "1e2");
        assert_eq!(canon("1E2", &[]), "1e2");
        assert_eq!(canon("-1.5E-07", &[]), "-1.5e-07");
        assert_eq!(canon("[1E+2,1e2,1e+2]", &[]), "[1e2,1e2,1e2]");
    }

    // ---- C3: strings ----

    #[test]
    fn c03_escaping_equivalences() {
        assert_eq!(canon(r#""\u00e9""#, &[]), canon("\"é\"", &[]));
        assert_eq!(canon(r#""\u00E9""#, &[]), "\"é\"");
        assert_eq!(canon(r#""\/""#, &[]), canon(r#""/""#, &[]));
        assert_eq!(canon(r#""\ud83d\ude00""#, &[]), canon("\"😀\"", &[]));
        assert_eq!(canon(r#""\uD83D\uDE00""#, &[]), "\"😀\"");
        assert_eq!(canon(r#""\u0041\u0022\u005c""#, &[]), r#""A\"\\""#);
        assert_eq!(canon(r#"{"\u0061":1}"#, &[]), r#"{"a":1}"#);
    }

    #[test]
    fn c03_strings_use_one_canonical_escaping() {
        assert_eq!(
            canon(r#""\b\f\n\r\t\u0008\u000C\u000a""#, &[]),
            r#""\b\f\n\r\t\b\f\n""#
        );
        assert_eq!(
            canon(r#""\u0000\u001F\u001b\u0001""#, &[]),
            r#""\u0000\u001f\u001b\u0001""#
        );
        assert_eq!(canon(r#""\u007f\u2028""#, &[]), "\"\u{7f}\u{2028}\"");
        assert_eq!(canon("\"\u{7f}/é\"", &[]), "\"\u{7f}/é\"");
        assert_eq!(canon(r#""a\"b\\c""#, &[]), r#""a\"b\\c""#);
    }

    // ---- C12: rejections ----

    #[test]
    fn c12_rejects_malformed_numbers() {
        for body in [
            "01",
            "-01",
            "00",
            "+1",
            ".5",
            "-.5",
            "1.",
            "1.e5",
            "1e",
            "1e+",
            "1E-",
            "-",
            "--1",
            "0x10",
            "1_000",
            "[01]",
            "{\"a\":01}",
            "1.5.2",
            "1e5e5",
        ] {
            rejected(body.as_bytes());
        }
        assert!(rejected(b"[01]").contains("leading zero"));
    }

    #[test]
    fn c12_rejects_nan_and_infinity() {
        for body in ["NaN", "-NaN", "Infinity", "-Infinity", "[nan]", "inf"] {
            rejected(body.as_bytes());
        }
    }

    #[test]
    fn c12_rejects_single_quotes() {
        rejected(b"'a'");
        rejected(b"{'a':1}");
        rejected(br#"{"a":'b'}"#);
    }

    #[test]
    fn c12_rejects_trailing_commas() {
        for body in [
            "[1,]",
            "[1,2, ]",
            r#"{"a":1,}"#,
            r#"{"a":1 , }"#,
            "[,]",
            "[,1]",
            "{,}",
            "1,",
        ] {
            rejected(body.as_bytes());
        }
    }

    #[test]
    fn c12_rejects_comments() {
        for body in ["// c\n1", "1 // c", "/* c */ 1", "[1 /* c */]", "# c\n1"] {
            rejected(body.as_bytes());
        }
    }

    #[test]
    fn c12_rejects_unescaped_control_characters_in_strings() {
        for c in 0u8..0x20 {
            let body = [b'"', b'a', c, b'"'];
            assert!(rejected(&body).contains("control character"), "{c:#x}");
        }
    }

    #[test]
    fn c12_rejects_invalid_escapes() {
        for body in [
            r#""\x41""#,
            r#""\a""#,
            r#""\U0041""#,
            r#""\u41""#,
            r#""\u00g1""#,
            r#""\'""#,
            r#""\0""#,
            r#""\""#,
            r#""\u""#,
            r#""\ u0041""#,
            r#""\u00e"#,
        ] {
            rejected(body.as_bytes());
        }
    }

    #[test]
    fn c12_rejects_invalid_utf8() {
        for body in [
            &b"\"\xff\""[..],
            b"\"\xc3\"",             // truncated sequence
            b"\"\xc0\xaf\"",         // overlong '/'
            b"\"\xed\xa0\x80\"",     // encoded surrogate
            b"\"\xf4\x90\x80\x80\"", // above U+10FFFF
            b"[1]\xff",
            b"\x80",
        ] {
            assert!(rejected(body).contains("UTF-8"), "{body:?}");
        }
    }

    #[test]
    fn c12_rejects_lone_or_misordered_surrogates() {
        for body in [
            r#""\ud83d""#,       // high alone
            r#""\ud83dx""#,      // high then a character
            r#""\ud83d\n""#,     // high then another escape
            r#""\ud83d\ud83d""#, // high then high
            r#""\ude00""#,       // low alone
            r#""\ude00\ud83d""#, // low before high
            r#""\ud83d\u0041""#, // high then a non-surrogate
            r#""\ud83d"#,        // high at the end of input
        ] {
            assert!(rejected(body.as_bytes()).contains("surrogate"), "{body}");
        }
    }

    #[test]
    fn c12_rejects_byte_order_mark() {
        assert!(rejected(b"\xEF\xBB\xBF{}").contains("byte order mark"));
        // The BOM character escaped inside a string is ordinary text.
        assert_eq!(canon(r#""\ufeff""#, &[]), "\"\u{feff}\"");
    }

    #[test]
    fn c12_rejects_trailing_data_and_multiple_values() {
        for body in [
            "{} {}",
            "1 2",
            "[]]",
            "{}}",
            "true false",
            "nullx",
            "truex",
            "\"a\"\"b\"",
        ] {
            rejected(body.as_bytes());
        }
    }

    #[test]
    fn c12_rejects_empty_and_non_json_whitespace() {
        for body in [
            "",
            " ",
            "\n\t\r ",
            "\u{b}1",
            "\u{c}1",
            "1\u{a0}",
            "\u{feff}1",
            "\u{2028}1",
        ] {
            rejected(body.as_bytes());
        }
        assert_eq!(canon(" \t\r\n1 \t\r\n", &[]), "1");
    }

    #[test]
    fn c12_rejects_structural_errors() {
        for body in [
            "{",
            "[",
            "[1",
            "[1,",
            "{\"a\"",
            "{\"a\":",
            "{\"a\":1",
            "{\"a\" 1}",
            "{1:2}",
            "{a:1}",
            "[1 2]",
            "{\"a\":1 \"b\":2}",
            "\"abc",
            "tru",
            "nul",
            "fals",
            "]",
            "}",
            ":",
            ",",
            "{\"a\":1]",
            "[1}",
            "{\"a\"::1}",
        ] {
            rejected(body.as_bytes());
        }
    }

    #[test]
    fn c12_rejects_duplicate_keys() {
        assert!(rejected(br#"{"amount":1,"amount":2}"#).contains("duplicate"));
        assert!(rejected(br#"{"amount":1,"amount":1}"#).contains("duplicate"));
        assert!(rejected(br#"{"a":1,"\u0061":2}"#).contains("duplicate"));
        assert!(rejected(r#"{"\u00e9":1,"é":2}"#.as_bytes()).contains("duplicate"));
        assert!(rejected(r#"{"\ud83d\ude00":1,"😀":2}"#.as_bytes()).contains("duplicate"));
        assert!(rejected(br#"{"x":{"k":1,"j":0,"k":2}}"#).contains("duplicate"));
        assert!(rejected(br#"[{"ok":1},{"k":1,"k":2}]"#).contains("duplicate"));
        assert!(rejected(br#"{"":1,"":2}"#).contains("duplicate"));
        // Same key in different objects, or in parent and child, is fine.
        assert_eq!(
            canon(r#"{"k":{"k":1},"j":{"k":2}}"#, &[]),
            r#"{"j":{"k":2},"k":{"k":1}}"#
        );
        assert!(rejected(br#"{"a":1,"b":2,"a":3}"#).ends_with("at byte 13"));
    }

    #[test]
    fn c12_depth_128_is_accepted() {
        let body = nested_arrays(MAX_DEPTH);
        assert_eq!(canon(&body, &[]), body);
        let body = nested_objects(MAX_DEPTH);
        assert_eq!(canon(&body, &[]), body);
    }

    #[test]
    fn c12_depth_129_is_rejected() {
        assert!(rejected(nested_arrays(MAX_DEPTH + 1).as_bytes()).contains("nesting"));
        assert!(rejected(nested_objects(MAX_DEPTH + 1).as_bytes()).contains("nesting"));
        let mixed = r#"{"a":["#.repeat(65) + &"]}".repeat(65);
        assert!(rejected(mixed.as_bytes()).contains("nesting"));
    }

    #[test]
    fn c12_depth_10000_is_rejected_without_overflow() {
        assert!(rejected(nested_arrays(10_000).as_bytes()).contains("nesting"));
        assert!(rejected(nested_objects(10_000).as_bytes()).contains("nesting"));
        assert!(rejected("[".repeat(10_000).as_bytes()).contains("nesting"));
    }

    #[test]
    fn c12_error_reason_is_short_and_does_not_echo_the_body() {
        let secret = "s3cr3t".repeat(10_000);
        let body = format!(r#"{{"card":"{secret}","x":01}}"#);
        let reason = rejected(body.as_bytes());
        assert!(reason.len() < 100, "{reason}");
        assert!(!reason.contains("s3cr3t"), "{reason}");
        assert!(reason.contains("at byte"), "{reason}");
        assert!(rejected(b"[1,,2]").ends_with("at byte 3"));
    }

    #[test]
    fn c12_large_inputs_stay_linear() {
        // 100k keys, 100k elements, a 1 MB string full of escapes: each well under a second.
        let keys: Vec<String> = (0..100_000).map(|i| format!("\"k{i}\":{i}")).collect();
        let body = format!("{{{}}}", keys.join(","));
        assert_eq!(canon_bytes(body.as_bytes()).len(), body.len());
        let body = format!("[{}]", vec!["[]"; 100_000].join(","));
        assert_eq!(canon_bytes(body.as_bytes()), body.as_bytes());
        let body = format!("\"{}\"", r"\u00e9\n".repeat(100_000));
        assert_eq!(canon_bytes(body.as_bytes()).len(), 2 + 4 * 100_000);
        let body = format!("[{}]", "123456789".repeat(100_000));
        assert_eq!(canon_bytes(body.as_bytes()), body.as_bytes());
    }

    // ---- properties ----

    /// A JSON string literal mixing raw text and every kind of escape.
    fn string_literal() -> impl Strategy<Value = String> {
        r#""([a-z é😀/~\x7f]|\\["\\/bfnrt]|\\u00[01][0-9a-fA-F]|\\u00[eE]9|\\u[dD]83[dD]\\u[dD][eE]00){0,6}""#
    }

    /// Valid JSON text with random whitespace, key order and number spellings.
    fn json_text() -> impl Strategy<Value = String> {
        let ws = "[ \t\r\n]{0,2}";
        let leaf = prop_oneof![
            Just("null".to_owned()),
            Just("true".to_owned()),
            Just("false".to_owned()),
            "-?(0|[1-9][0-9]{0,25})(\\.[0-9]{1,25})?([eE][+-]?[0-9]{1,4})?",
            string_literal(),
        ];
        leaf.prop_recursive(5, 48, 6, move |inner| {
            prop_oneof![
                prop::collection::vec((ws, inner.clone()), 0..6).prop_map(|items| {
                    let items: Vec<String> = items.into_iter().map(|(w, v)| w + &v).collect();
                    format!("[{}]", items.join(","))
                }),
                prop::collection::btree_map("[a-zé/~]{0,3}", (ws, inner), 0..6).prop_map(|m| {
                    let members: Vec<String> = m
                        .into_iter()
                        .rev()
                        .map(|(k, (w, v))| format!("\"{k}\"{w}:{w}{v}"))
                        .collect();
                    format!("{{{}}}", members.join(" ,"))
                }),
            ]
        })
    }

    /// Fragments of almost-JSON, to reach the error paths.
    fn token_soup() -> impl Strategy<Value = Vec<u8>> {
        let tokens: Vec<&'static [u8]> = vec![
            b"{",
            b"}",
            b"[",
            b"]",
            b",",
            b":",
            b" ",
            b"\"",
            b"\"a\"",
            b"\"\\u00e9\"",
            b"\\",
            b"\\ud83d",
            b"\\ude00",
            b"\\u",
            b"0",
            b"1",
            b"-",
            b"+",
            b".",
            b"e",
            b"E",
            b"true",
            b"null",
            b"\xff",
            b"\xc3\xa9",
            b"\x00",
            b"\n",
            b"'",
            b"/",
            b"~",
        ];
        prop::collection::vec(prop::sample::select(tokens), 0..40).prop_map(|parts| parts.concat())
    }

    fn check_no_panic_and_idempotent(body: &[u8]) -> Result<(), TestCaseError> {
        if let Ok(once) = canonical_json(body, &[]) {
            let twice = canonical_json(&once, &[])
                .map_err(|e| TestCaseError::fail(format!("canonical output rejected: {e}")))?;
            prop_assert_eq!(&twice, &once);
            prop_assert!(once.len() <= body.len());
        }
        for path in ["a", "/a/0", "/0", "/"] {
            if let Ok(once) = canonical_json(body, &[path]) {
                let twice = canonical_json(&once, &[])
                    .map_err(|e| TestCaseError::fail(format!("canonical output rejected: {e}")))?;
                prop_assert_eq!(twice, once);
            }
        }
        Ok(())
    }

    proptest! {
        #[test]
        fn c12_arbitrary_bytes_never_panic_and_canonical_is_idempotent(
            body in prop::collection::vec(any::<u8>(), 0..256)
        ) {
            check_no_panic_and_idempotent(&body)?;
        }

        #[test]
        fn c12_near_json_never_panics_and_canonical_is_idempotent(body in token_soup()) {
            check_no_panic_and_idempotent(&body)?;
        }

        #[test]
        fn c03_valid_json_is_accepted_and_canonical_is_idempotent(text in json_text()) {
            let once = canonical_json(text.as_bytes(), &[])
                .map_err(|e| TestCaseError::fail(format!("{text:?} rejected: {e}")))?;
            let twice = canonical_json(&once, &[])
                .map_err(|e| TestCaseError::fail(format!("canonical output rejected: {e}")))?;
            prop_assert_eq!(&twice, &once);
            check_no_panic_and_idempotent(text.as_bytes())?;
        }
    }
}
