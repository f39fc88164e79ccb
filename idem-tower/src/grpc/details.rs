//! `grpc-status-details-bin`: a `google.rpc.Status` carrying a `google.rpc.RetryInfo`, with the
//! messages written by hand (no `protoc`), field numbers as in google/rpc/status.proto,
//! google/rpc/error_details.proto, google/protobuf/any.proto and duration.proto.

use base64::engine::general_purpose::STANDARD_NO_PAD;
use base64::Engine as _;
use prost::Message;
use std::time::Duration;

/// `google.rpc.Status`.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct RpcStatus {
    /// The gRPC code.
    #[prost(int32, tag = "1")]
    pub code: i32,
    /// The developer-facing message.
    #[prost(string, tag = "2")]
    pub message: String,
    /// Typed details.
    #[prost(message, repeated, tag = "3")]
    pub details: Vec<Any>,
}

/// `google.protobuf.Any`.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct Any {
    /// `type.googleapis.com/<full message name>`.
    #[prost(string, tag = "1")]
    pub type_url: String,
    /// The encoded message.
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}

/// `google.rpc.RetryInfo`.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct RetryInfo {
    /// How long to wait before retrying.
    #[prost(message, optional, tag = "1")]
    pub retry_delay: Option<ProtoDuration>,
}

/// `google.protobuf.Duration`.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct ProtoDuration {
    /// Whole seconds.
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    /// Nanoseconds, 0..1e9.
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}

/// The type URL of `google.rpc.RetryInfo` in an `Any`.
pub(crate) const RETRY_INFO_TYPE: &str = "type.googleapis.com/google.rpc.RetryInfo";

/// The value of `grpc-status-details-bin` for `code` and `message` with a `RetryInfo` of
/// `delay`: base64 without padding, as gRPC sends binary metadata.
pub(crate) fn retry_details(code: i32, message: &str, delay: Duration) -> String {
    let retry = RetryInfo {
        retry_delay: Some(ProtoDuration {
            seconds: i64::try_from(delay.as_secs()).unwrap_or(i64::MAX),
            nanos: i32::try_from(delay.subsec_nanos()).unwrap_or(0),
        }),
    };
    let status = RpcStatus {
        code,
        message: message.to_owned(),
        details: vec![Any {
            type_url: RETRY_INFO_TYPE.to_owned(),
            value: retry.encode_to_vec(),
        }],
    };
    STANDARD_NO_PAD.encode(status.encode_to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_retry_delay_decodes_from_the_details() {
        let value = retry_details(10, "busy", Duration::from_millis(1500));
        let bytes = STANDARD_NO_PAD.decode(value).expect("base64");
        let status = RpcStatus::decode(bytes.as_slice()).expect("a google.rpc.Status");
        assert_eq!((status.code, status.message.as_str()), (10, "busy"));
        assert_eq!(status.details.len(), 1);
        assert_eq!(status.details[0].type_url, RETRY_INFO_TYPE);
        let retry = RetryInfo::decode(status.details[0].value.as_slice()).expect("a RetryInfo");
        assert_eq!(
            retry.retry_delay,
            Some(ProtoDuration {
                seconds: 1,
                nanos: 500_000_000
            })
        );
    }

    #[test]
    fn the_messages_use_the_field_numbers_of_google_rpc() {
        // Field 1 varint (code 14), field 2 length-delimited ("x"): the wire form of
        // `google.rpc.Status { code: 14, message: "x" }`, written out by hand.
        let status = RpcStatus {
            code: 14,
            message: "x".into(),
            details: vec![],
        };
        assert_eq!(status.encode_to_vec(), vec![0x08, 14, 0x12, 1, b'x']);
    }
}
