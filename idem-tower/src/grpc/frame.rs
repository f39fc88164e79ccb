//! The request message of a unary call, out of its gRPC frame: what is fingerprinted (C3).

/// Why a protected call's body is not one uncompressed message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FrameError {
    /// No message, or more than one (a client-streaming call): `INVALID_ARGUMENT`.
    NotOneMessage,
    /// The message is compressed: `UNIMPLEMENTED` (the layer fingerprints only the bytes as
    /// the client encoded them, and does not decompress), with `grpc-accept-encoding: identity`.
    Compressed,
}

/// The one message of a unary call's body: a 5-byte prefix (compressed flag, big-endian
/// length) and the encoded message, and nothing after it.
pub(crate) fn single_message(body: &[u8]) -> Result<&[u8], FrameError> {
    let Some((prefix, rest)) = body.split_first_chunk::<5>() else {
        return Err(FrameError::NotOneMessage);
    };
    let [flag, length @ ..] = *prefix;
    let length = usize::try_from(u32::from_be_bytes(length)).unwrap_or(usize::MAX);
    if rest.len() != length {
        return Err(FrameError::NotOneMessage);
    }
    match flag {
        0 => Ok(rest),
        1 => Err(FrameError::Compressed),
        _ => Err(FrameError::NotOneMessage),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c03_the_message_is_the_frame_payload() {
        assert_eq!(single_message(b"\0\0\0\0\x02hi"), Ok(&b"hi"[..]));
        assert_eq!(single_message(b"\0\0\0\0\0"), Ok(&b""[..]));
    }

    #[test]
    fn two_messages_none_or_a_compressed_one_are_refused() {
        assert_eq!(single_message(b""), Err(FrameError::NotOneMessage));
        assert_eq!(single_message(b"\0\0\0"), Err(FrameError::NotOneMessage));
        assert_eq!(
            single_message(b"\0\0\0\0\x01a\0\0\0\0\x01b"),
            Err(FrameError::NotOneMessage)
        );
        assert_eq!(
            single_message(b"\0\0\0\0\x05ab"),
            Err(FrameError::NotOneMessage)
        );
        assert_eq!(
            single_message(b"\x01\0\0\0\x01a"),
            Err(FrameError::Compressed)
        );
    }
}
