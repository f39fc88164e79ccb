//! A script's reply packed into one MessagePack string (`cmsgpack.pack` in `lua/reserve.lua`),
//! read back into its values. A client's RESP parser spends far more on each value of a reply
//! than Redis spends packing them in C, so a reservation answers with its values in one string
//! beside the response instead of eleven values: about 9 000 instructions less per answer on
//! the client, 2% more on the server.
//! A stored response rides beside the packed values, not in them: packing would copy a large
//! body again inside Redis (2.4 – 2.8 times the server's time for a 1 MiB replay).
//!
//! Only what `cmsgpack.pack` writes for the script's values is read: strings (any bytes; the
//! binary forms too), unsigned integers, and `false` or nil (a missing field); anything else
//! (a float, a negative number, an array, a map) is the store's error.

use crate::error::{unexpected, BACKEND};
use idem_core::{Error, StoreErrorKind};
use redis::Value;

/// One value as the script packed it, borrowed from its reply: a string (any bytes), an
/// unsigned integer, or `false` / nil (a missing field).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Packed<'a> {
    Text(&'a [u8]),
    Int(i64),
    Nil,
}

impl<'a> Packed<'a> {
    /// A value of a plain reply seen as a packed one: a string, an integer or nil; anything
    /// else (an array, an error) is `None`.
    pub(crate) fn of(value: &'a Value) -> Option<Self> {
        match value {
            Value::BulkString(bytes) => Some(Packed::Text(bytes)),
            Value::SimpleString(text) => Some(Packed::Text(text.as_bytes())),
            Value::Int(n) => Some(Packed::Int(*n)),
            Value::Nil => Some(Packed::Nil),
            _ => None,
        }
    }
}

/// A reply `{packed values, response}`: the packed string and the response (or nil) as Redis
/// sent it, moved. A reply of another shape is the store's error, naming `what` returned it
/// and never printing a response.
pub(crate) fn split(reply: Value, what: &str) -> Result<(Value, Value), Error> {
    let shape = |found: String| {
        Error::store(
            BACKEND,
            StoreErrorKind::Other,
            format!("{what} returned {found}, not its packed values and a response"),
        )
    };
    let Value::Array(parts) = reply else {
        return Err(shape("another kind of reply".to_owned()));
    };
    let count = parts.len();
    let Ok([packed, response]) = <[Value; 2]>::try_from(parts) else {
        return Err(shape(format!("{count} values")));
    };
    Ok((packed, response))
}

/// The values of `reply`, at most `N` of them, borrowed (the rest of the array `Nil`), and how
/// many there are. A reply that is not one packed string of at most `N` values is the store's
/// error, naming `what` returned it and how long it is, never its bytes: a hostile string
/// costs no more memory than its own size.
pub(crate) fn unpack<'a, const N: usize>(
    reply: &'a Value,
    what: &str,
) -> Result<([Packed<'a>; N], usize), Error> {
    let Value::BulkString(packed) = reply else {
        return Err(unexpected(what, reply));
    };
    let unreadable = || {
        Error::store(
            BACKEND,
            StoreErrorKind::Other,
            format!(
                "{what} returned {} bytes that are not at most {N} packed values",
                packed.len()
            ),
        )
    };
    let mut values = [Packed::Nil; N];
    let mut count = 0;
    let mut rest = packed.as_slice();
    while !rest.is_empty() {
        let (Some(slot), Some((value, after))) = (values.get_mut(count), next(rest)) else {
            return Err(unreadable());
        };
        *slot = value;
        count += 1;
        rest = after;
    }
    Ok((values, count))
}

/// The first value of `packed` and what follows it; `None` if it is not one the script writes,
/// or is cut short.
fn next(packed: &[u8]) -> Option<(Packed<'_>, &[u8])> {
    let (&marker, rest) = packed.split_first()?;
    let (length, rest) = match marker {
        0x00..=0x7f => return Some((Packed::Int(i64::from(marker)), rest)),
        0xc0 | 0xc2 => return Some((Packed::Nil, rest)),
        0xcc..=0xcf => {
            let (bytes, rest) = cut(rest, 1 << (marker - 0xcc))?;
            let number = bytes.iter().fold(0u64, |n, &b| n << 8 | u64::from(b));
            return Some((Packed::Int(i64::try_from(number).ok()?), rest));
        }
        0xa0..=0xbf => (usize::from(marker & 0x1f), rest),
        0xd9 | 0xc4 => width(rest, 1)?,
        0xda | 0xc5 => width(rest, 2)?,
        0xdb | 0xc6 => width(rest, 4)?,
        _ => return None,
    };
    let (bytes, rest) = cut(rest, length)?;
    Some((Packed::Text(bytes), rest))
}

/// A big-endian length of `size` bytes, and what follows it.
fn width(packed: &[u8], size: usize) -> Option<(usize, &[u8])> {
    let (bytes, rest) = cut(packed, size)?;
    let length = bytes.iter().fold(0usize, |n, &b| n << 8 | usize::from(b));
    Some((length, rest))
}

/// `packed` cut at `at`, if it is that long.
fn cut(packed: &[u8], at: usize) -> Option<(&[u8], &[u8])> {
    (at <= packed.len()).then(|| packed.split_at(at))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The most values a reservation's reply packs.
    const MAX_VALUES: usize = 10;

    fn bulk(bytes: &[u8]) -> Value {
        Value::BulkString(bytes.to_vec())
    }

    fn values<const N: usize>(reply: &Value) -> Result<Vec<Packed<'_>>, Error> {
        let (values, count) = unpack::<N>(reply, "reserve")?;
        Ok(values[..count].to_vec())
    }

    #[test]
    fn strings_of_any_bytes_integers_and_false_are_read_back() {
        let long = vec![b':'; 300];
        let mut packed = vec![0xa3, b'a', 0, b'-', 0xc2, 0x01, 0x7f, 0xcc, 0xff];
        packed.extend([0xcd, 0x01, 0x00, 0xce, 0x00, 0x01, 0x00, 0x00]);
        packed.extend([0xcf, 0, 0, 0x01, 0xa2, 0x48, 0xde, 0x37, 0x23]);
        packed.extend([0xd9, 0x02, b'\r', b'\n', 0xc4, 0x00, 0xc0]);
        packed.extend([0xda, 0x01, 0x2c]);
        packed.extend(&long);
        let packed = Value::BulkString(packed);
        assert_eq!(
            values::<12>(&packed).expect("unpacks"),
            vec![
                Packed::Text(b"a\0-"),
                Packed::Nil,
                Packed::Int(1),
                Packed::Int(127),
                Packed::Int(255),
                Packed::Int(256),
                Packed::Int(65_536),
                Packed::Int(1_796_518_852_387),
                Packed::Text(b"\r\n"),
                Packed::Text(b""),
                Packed::Nil,
                Packed::Text(&long),
            ]
        );
        assert_eq!(values::<MAX_VALUES>(&bulk(b"")).expect("unpacks"), vec![]);
    }

    #[test]
    fn more_values_than_expected_are_refused_without_printing_them() {
        // 16 MiB of zeros: sixteen million one-byte integers, refused at the eleventh.
        let hostile = bulk(&vec![0; 16 << 20]);
        let error = unpack::<MAX_VALUES>(&hostile, "the read header").expect_err("too many");
        assert!(error.to_string().len() < 200, "{error}");
        assert!(error.to_string().contains("16777216 bytes"), "{error}");
        let eleven = bulk(&[0x01; MAX_VALUES + 1]);
        assert!(values::<MAX_VALUES>(&eleven).is_err());
        let ten = bulk(&[0x01; MAX_VALUES]);
        assert_eq!(values::<MAX_VALUES>(&ten).expect("ten").len(), MAX_VALUES);
    }

    #[test]
    fn a_reply_is_its_packed_values_and_the_response_beside_them() {
        let body = bulk(b"\xc2 a body");
        let packed = bulk(&[0xa1, b'x', 0x01]);
        let (got, response) =
            split(Value::Array(vec![packed.clone(), body.clone()]), "reserve").expect("splits");
        assert_eq!((&got, response), (&packed, body));
        assert_eq!(
            values::<MAX_VALUES>(&got).expect("unpacks"),
            vec![Packed::Text(b"x"), Packed::Int(1)]
        );
        for reply in [
            Value::Array(vec![bulk(&[0xa1, b'x'])]),
            Value::Array(vec![bulk(&[0xa1, b'x']), Value::Nil, Value::Nil]),
            bulk(&[0xa1, b'x']),
        ] {
            let error = split(reply.clone(), "reserve").expect_err("a shape of its own");
            assert!(!error.to_string().contains("Nil"), "{error}");
        }
        let secret = bulk(b"a secret body");
        let error = split(Value::Array(vec![secret.clone(); 3]), "reserve").expect_err("3");
        assert!(!error.to_string().contains("secret"), "{error}");
    }

    #[test]
    fn a_reply_that_is_not_one_packed_string_of_the_scripts_values_is_an_error() {
        for reply in [
            bulk(&[0xa3, b'a', b'b']),
            bulk(&[0xd9]),
            bulk(&[0xda, 0x01]),
            bulk(&[0xcd, 0x01]),
            bulk(&[0xcf, 0x80, 0, 0, 0, 0, 0, 0, 0]),
            bulk(&[0xff]),
            bulk(&[0xcb, 0, 0, 0, 0, 0, 0, 0, 0]),
            bulk(&[0x91, 0x01]),
            Value::Array(vec![bulk(&[0xa1, b'a'])]),
            Value::Nil,
        ] {
            assert!(values::<MAX_VALUES>(&reply).is_err(), "{reply:?}");
        }
    }
}
