//! [`GrpcAnswer`]: a gRPC answer as it is stored and replayed, and its stored encoding.

use super::body::AnswerBody;
use super::status::{http_status_of, percent_encode};
use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};
use http::Response;
use idem_core::{is_never_stored, Error, StoredResponse};
use tonic::Code;

/// What starts the body of every stored gRPC answer (and its version).
const MAGIC: &[u8] = b"idem-grpc\x01";

/// Response metadata that gives the messages their meaning, kept whatever the policy's
/// allow-list says (as `Content-Encoding` is for HTTP, C7).
const TRAVELS_WITH_BODY: &[&str] = &["grpc-encoding"];

/// A gRPC answer, as stored and replayed (C7): the initial metadata (filtered by the engine's
/// policy like HTTP headers: `content-type` always, others only when allow-listed), the
/// response body as sent (the length-prefixed messages, byte for byte), and the trailers
/// (`grpc-status`, `grpc-message`, `grpc-status-details-bin`, and of the handler's own trailing
/// metadata what the policy's allow-list keeps, the rule of the initial metadata; never a
/// [never stored](idem_core::is_never_stored) one). An answer sent
/// "trailers-only" (an error status with no message: what tonic sends for `Err(Status)`) is
/// replayed the same way.
///
/// A handler that completes in its own transaction stores one of these
/// ([`into_stored`](Self::into_stored)) through its `Reservation`.
///
/// ```
/// use idem_tower::GrpcAnswer;
/// let answer = GrpcAnswer::ok_encoded(b"\x0a\x04ch_1".to_vec()).with_trailer("x-charge", "ch_1");
/// let stored = answer.clone().into_stored();
/// assert_eq!(stored.status, 200);
/// assert_eq!(GrpcAnswer::from_stored(&stored)?, answer);
/// assert_eq!(GrpcAnswer::error(tonic::Code::NotFound, "no such charge").code(), tonic::Code::NotFound);
/// # Ok::<(), idem_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrpcAnswer {
    /// The initial metadata (names lower-cased).
    pub metadata: Vec<(String, Vec<u8>)>,
    /// The response body as sent: the length-prefixed messages.
    pub body: Vec<u8>,
    /// The trailing metadata, `grpc-status` included.
    pub trailers: Vec<(String, Vec<u8>)>,
    /// Sent as one `HEADERS` frame with no body (the trailers in the head).
    pub trailers_only: bool,
}

impl GrpcAnswer {
    /// `OK` with one message, already encoded (its protobuf bytes; the 5-byte prefix is
    /// added here).
    pub fn ok_encoded(message: Vec<u8>) -> Self {
        let mut body = Vec::with_capacity(message.len() + 5);
        body.push(0);
        body.extend_from_slice(
            &u32::try_from(message.len())
                .unwrap_or(u32::MAX)
                .to_be_bytes(),
        );
        body.extend_from_slice(&message);
        Self {
            metadata: vec![("content-type".into(), b"application/grpc".to_vec())],
            body,
            trailers: vec![("grpc-status".into(), b"0".to_vec())],
            trailers_only: false,
        }
    }

    /// `OK` with one message.
    pub fn ok(message: &impl prost::Message) -> Self {
        Self::ok_encoded(message.encode_to_vec())
    }

    /// A status with no message (trailers-only), as tonic sends an `Err(Status)`.
    pub fn error(code: Code, message: &str) -> Self {
        let mut trailers = vec![("grpc-status".into(), (code as i32).to_string().into_bytes())];
        if !message.is_empty() {
            trailers.push(("grpc-message".into(), percent_encode(message).into_bytes()));
        }
        Self {
            metadata: vec![("content-type".into(), b"application/grpc".to_vec())],
            body: Vec::new(),
            trailers,
            trailers_only: true,
        }
    }

    /// Adds trailing metadata (the name is lower-cased).
    pub fn with_trailer(mut self, name: &str, value: impl AsRef<[u8]>) -> Self {
        self.trailers
            .push((name.to_ascii_lowercase(), value.as_ref().to_vec()));
        self
    }

    /// The answer's `grpc-status`; `UNKNOWN` when it has none (a broken response).
    pub fn code(&self) -> Code {
        self.trailer("grpc-status")
            .map_or(Code::Unknown, Code::from_bytes)
    }

    /// The first trailer `name`.
    pub fn trailer(&self, name: &str) -> Option<&[u8]> {
        self.trailers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    }

    /// The answer as the engine stores it: the HTTP equivalent of its code as the status
    /// ([`http_status_of`]), the initial metadata as headers, and the body, trailers and
    /// meaning-giving metadata (`grpc-encoding`) in idem's encoding.
    pub fn into_stored(self) -> StoredResponse {
        let status = http_status_of(self.code());
        let (travel, metadata): (Vec<_>, Vec<_>) = self
            .metadata
            .into_iter()
            .partition(|(n, _)| TRAVELS_WITH_BODY.iter().any(|t| t.eq_ignore_ascii_case(n)));
        let trailers: Vec<_> = self
            .trailers
            .into_iter()
            .filter(|(n, _)| !is_never_stored(n))
            .collect();
        let mut out = MAGIC.to_vec();
        out.push(u8::from(self.trailers_only));
        put_bytes(&mut out, &self.body);
        put_entries(&mut out, &trailers);
        put_entries(&mut out, &travel);
        let mut stored = StoredResponse::new(status, out);
        for (name, value) in metadata {
            stored = stored.with_header(&name, value);
        }
        stored
    }

    /// The answer a stored response holds. A response that is not one (a record written by
    /// something else, a damaged one) is [`Error::CorruptRecord`] (C12): answered `INTERNAL`,
    /// never run again.
    pub fn from_stored(stored: &StoredResponse) -> Result<Self, Error> {
        let corrupt = |what: &str| Error::CorruptRecord(format!("stored gRPC answer: {what}"));
        let mut rest = stored
            .body
            .strip_prefix(MAGIC)
            .ok_or_else(|| corrupt("not idem's gRPC encoding"))?;
        let (&flags, tail) = rest.split_first().ok_or_else(|| corrupt("truncated"))?;
        rest = tail;
        let body = take_bytes(&mut rest).ok_or_else(|| corrupt("truncated body"))?;
        let trailers = take_entries(&mut rest).ok_or_else(|| corrupt("truncated trailers"))?;
        let travel = take_entries(&mut rest).ok_or_else(|| corrupt("truncated metadata"))?;
        if !rest.is_empty() || flags > 1 {
            return Err(corrupt("trailing bytes"));
        }
        let mut metadata = stored.headers.clone();
        metadata.extend(travel);
        let answer = Self {
            metadata,
            body: body.to_vec(),
            trailers,
            trailers_only: flags == 1,
        };
        for (name, value) in answer.metadata.iter().chain(&answer.trailers) {
            if HeaderName::from_bytes(name.as_bytes()).is_err()
                || HeaderValue::from_bytes(value).is_err()
            {
                return Err(corrupt("an entry that is not valid metadata"));
            }
        }
        Ok(answer)
    }

    /// The HTTP response that carries this answer, with `extra` metadata added to its head.
    pub(crate) fn into_http(
        self,
        extra: &[(HeaderName, HeaderValue)],
    ) -> Response<tonic::body::Body> {
        let mut head = HeaderMap::new();
        append(&mut head, &self.metadata);
        if !head.contains_key(CONTENT_TYPE) {
            head.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        }
        for (name, value) in extra {
            head.insert(name.clone(), value.clone());
        }
        let body = if self.trailers_only {
            append(&mut head, &self.trailers);
            AnswerBody::new(Bytes::new(), None)
        } else {
            let mut trailers = HeaderMap::new();
            append(&mut trailers, &self.trailers);
            AnswerBody::new(Bytes::from(self.body), Some(trailers))
        };
        let mut response = Response::new(tonic::body::Body::new(body));
        *response.headers_mut() = head;
        response
    }
}

/// Appends the entries that are valid metadata (all of them, for an answer decoded by
/// [`GrpcAnswer::from_stored`]).
fn append(map: &mut HeaderMap, entries: &[(String, Vec<u8>)]) {
    for (name, value) in entries {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(value),
        ) {
            map.append(name, value);
        }
    }
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&u32::try_from(bytes.len()).unwrap_or(u32::MAX).to_be_bytes());
    out.extend_from_slice(bytes);
}

fn put_entries(out: &mut Vec<u8>, entries: &[(String, Vec<u8>)]) {
    out.extend_from_slice(
        &u32::try_from(entries.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes(),
    );
    for (name, value) in entries {
        put_bytes(out, name.as_bytes());
        put_bytes(out, value);
    }
}

fn take_u32(rest: &mut &[u8]) -> Option<usize> {
    let (head, tail) = rest.split_first_chunk::<4>()?;
    *rest = tail;
    usize::try_from(u32::from_be_bytes(*head)).ok()
}

fn take_bytes<'a>(rest: &mut &'a [u8]) -> Option<&'a [u8]> {
    let len = take_u32(rest)?;
    if rest.len() < len {
        return None;
    }
    let (bytes, tail) = rest.split_at(len);
    *rest = tail;
    Some(bytes)
}

fn take_entries(rest: &mut &[u8]) -> Option<Vec<(String, Vec<u8>)>> {
    let count = take_u32(rest)?;
    // Each entry takes at least 8 bytes: a count beyond that is damage, not an allocation.
    if count > rest.len() / 8 {
        return None;
    }
    let mut entries = Vec::with_capacity(count);
    for _ in 0..count {
        let name = std::str::from_utf8(take_bytes(rest)?).ok()?.to_owned();
        let value = take_bytes(rest)?.to_vec();
        entries.push((name, value));
    }
    Some(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> GrpcAnswer {
        let mut answer = GrpcAnswer::ok_encoded(b"\x08\x01".to_vec())
            .with_trailer("x-ledger", "l-1")
            .with_trailer("grpc-status-details-bin", "CAE");
        answer
            .metadata
            .push(("grpc-encoding".into(), b"identity".to_vec()));
        answer
    }

    #[test]
    fn c07_an_answer_survives_its_stored_encoding_exactly() {
        let answer = sample();
        let decoded = GrpcAnswer::from_stored(&answer.clone().into_stored()).expect("decodes");
        assert_eq!(decoded.body, answer.body);
        assert_eq!(decoded.trailers, answer.trailers);
        assert!(decoded
            .metadata
            .contains(&("grpc-encoding".into(), b"identity".to_vec())));
        let error = GrpcAnswer::error(Code::AlreadyExists, "exists");
        let stored = error.clone().into_stored();
        assert_eq!(stored.status, 409);
        assert_eq!(GrpcAnswer::from_stored(&stored).expect("decodes"), error);
    }

    #[test]
    fn c07_never_stored_trailers_are_dropped() {
        let answer = sample().with_trailer("set-cookie", "s=1");
        let decoded = GrpcAnswer::from_stored(&answer.into_stored()).expect("decodes");
        assert_eq!(decoded.trailer("set-cookie"), None);
        assert_eq!(decoded.trailer("x-ledger"), Some(&b"l-1"[..]));
    }

    #[test]
    fn c12_a_damaged_or_foreign_stored_answer_is_a_corrupt_record() {
        let good = sample().into_stored();
        for cut in 0..good.body.len() {
            let mut damaged = good.clone();
            damaged.body.truncate(cut);
            assert!(
                matches!(
                    GrpcAnswer::from_stored(&damaged),
                    Err(Error::CorruptRecord(_))
                ),
                "cut at {cut}"
            );
        }
        let mut longer = good.clone();
        longer.body.push(0);
        assert!(GrpcAnswer::from_stored(&longer).is_err());
        let http = StoredResponse::new(200, r#"{"id":"ch_1"}"#);
        assert!(matches!(
            GrpcAnswer::from_stored(&http),
            Err(Error::CorruptRecord(_))
        ));
    }

    #[test]
    fn a_missing_status_reads_as_unknown() {
        let mut answer = sample();
        answer.trailers.clear();
        assert_eq!(answer.code(), Code::Unknown);
        assert_eq!(answer.into_stored().status, 500);
    }
}
