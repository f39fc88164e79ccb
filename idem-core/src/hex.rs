//! Lower-case hexadecimal, the one form idem writes digests in (a record's digest in an
//! announcement, a downstream key).

const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// `bytes` as lower-case hexadecimal, two digits a byte.
pub(crate) fn lower(bytes: &[u8]) -> String {
    let mut text = String::with_capacity(2 * bytes.len());
    for byte in bytes {
        text.push(char::from(DIGITS[usize::from(byte >> 4)]));
        text.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
    text
}

#[cfg(test)]
mod tests {
    #[test]
    fn two_lower_case_digits_a_byte() {
        assert_eq!(super::lower(&[0x00, 0x0f, 0xa5, 0xff]), "000fa5ff");
    }
}
