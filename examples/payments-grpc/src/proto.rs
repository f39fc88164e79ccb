//! The messages of `payments.v1.Charges`, written by hand with prost's derive (no `protoc`).
//! They implement `charges.proto`, at the root of this package (what grpcurl's `-proto` takes):
//!
#![doc = concat!("```proto\n", include_str!("../charges.proto"), "```")]

use prost::Message;

/// `payments.v1.CreateChargeRequest`.
#[derive(Clone, PartialEq, Message)]
pub struct CreateChargeRequest {
    /// In the currency's smallest unit (cents).
    #[prost(int64, tag = "1")]
    pub amount: i64,
    /// ISO 4217, lower case.
    #[prost(string, tag = "2")]
    pub currency: String,
    /// Free text.
    #[prost(string, tag = "3")]
    pub description: String,
    /// AIP-155's request id: the idempotency key when the `idempotency-key` metadata entry is
    /// not sent.
    #[prost(string, tag = "4")]
    pub request_id: String,
}

/// `payments.v1.GetChargeRequest`.
#[derive(Clone, PartialEq, Message)]
pub struct GetChargeRequest {
    /// The charge's id.
    #[prost(string, tag = "1")]
    pub id: String,
}

/// `payments.v1.Charge`.
#[derive(Clone, PartialEq, Message)]
pub struct Charge {
    /// `ch_` and 24 letters and digits.
    #[prost(string, tag = "1")]
    pub id: String,
    /// In the currency's smallest unit.
    #[prost(int64, tag = "2")]
    pub amount: i64,
    /// ISO 4217, lower case.
    #[prost(string, tag = "3")]
    pub currency: String,
    /// Free text.
    #[prost(string, tag = "4")]
    pub description: String,
    /// Unix seconds.
    #[prost(int64, tag = "5")]
    pub created: i64,
}

/// The service's name.
pub const SERVICE: &str = "payments.v1.Charges";
/// The path of `CreateCharge`.
pub const CREATE_CHARGE: &str = "/payments.v1.Charges/CreateCharge";
/// The path of `GetCharge`.
pub const GET_CHARGE: &str = "/payments.v1.Charges/GetCharge";

/// The AIP-155 key of an encoded `CreateChargeRequest`: its `request_id`, when set.
///
/// ```
/// use payments_grpc::proto::{request_id, CreateChargeRequest};
/// use prost::Message;
/// let request = CreateChargeRequest { amount: 1, request_id: "req-1".into(), ..Default::default() };
/// assert_eq!(request_id(&request.encode_to_vec()).as_deref(), Some("req-1"));
/// ```
pub fn request_id(message: &[u8]) -> Option<String> {
    let request = CreateChargeRequest::decode(message).ok()?;
    (!request.request_id.is_empty()).then_some(request.request_id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// The field numbers `charges.proto` gives each message's fields: `message -> field -> n`.
    fn proto_numbers() -> BTreeMap<String, BTreeMap<String, u32>> {
        let mut out: BTreeMap<String, BTreeMap<String, u32>> = BTreeMap::new();
        let mut current: Option<String> = None;
        for line in include_str!("../charges.proto").lines() {
            let line = line.split("//").next().unwrap_or_default().trim();
            if let Some(rest) = line.strip_prefix("message ") {
                let name = rest.trim_end_matches('{').trim().to_owned();
                out.entry(name.clone()).or_default();
                current = Some(name);
            } else if line.starts_with('}') {
                current = None;
            } else if let (Some(message), Some((decl, number))) = (&current, line.split_once('=')) {
                let field = decl.split_whitespace().last().expect("a field name");
                let number = number.trim().trim_end_matches(';').trim();
                let number = number.parse().expect("a field number");
                out.entry(message.clone())
                    .or_default()
                    .insert(field.to_owned(), number);
            }
        }
        out
    }

    /// The field number prost writes for a message with one field set: its first tag.
    fn number_of(encoded: &[u8]) -> u32 {
        let (mut value, mut shift) = (0_u32, 0);
        for byte in encoded {
            value |= u32::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return value >> 3;
            }
            shift += 7;
        }
        panic!("no tag in {encoded:?}")
    }

    #[test]
    fn the_messages_have_the_field_numbers_of_charges_proto() {
        let text = || "x".to_owned();
        let derived: BTreeMap<String, BTreeMap<String, u32>> = [
            (
                "CreateChargeRequest",
                vec![
                    (
                        "amount",
                        CreateChargeRequest {
                            amount: 1,
                            ..Default::default()
                        }
                        .encode_to_vec(),
                    ),
                    (
                        "currency",
                        CreateChargeRequest {
                            currency: text(),
                            ..Default::default()
                        }
                        .encode_to_vec(),
                    ),
                    (
                        "description",
                        CreateChargeRequest {
                            description: text(),
                            ..Default::default()
                        }
                        .encode_to_vec(),
                    ),
                    (
                        "request_id",
                        CreateChargeRequest {
                            request_id: text(),
                            ..Default::default()
                        }
                        .encode_to_vec(),
                    ),
                ],
            ),
            (
                "GetChargeRequest",
                vec![("id", GetChargeRequest { id: text() }.encode_to_vec())],
            ),
            (
                "Charge",
                vec![
                    (
                        "id",
                        Charge {
                            id: text(),
                            ..Default::default()
                        }
                        .encode_to_vec(),
                    ),
                    (
                        "amount",
                        Charge {
                            amount: 1,
                            ..Default::default()
                        }
                        .encode_to_vec(),
                    ),
                    (
                        "currency",
                        Charge {
                            currency: text(),
                            ..Default::default()
                        }
                        .encode_to_vec(),
                    ),
                    (
                        "description",
                        Charge {
                            description: text(),
                            ..Default::default()
                        }
                        .encode_to_vec(),
                    ),
                    (
                        "created",
                        Charge {
                            created: 1,
                            ..Default::default()
                        }
                        .encode_to_vec(),
                    ),
                ],
            ),
        ]
        .into_iter()
        .map(|(message, fields)| {
            let numbers = fields
                .into_iter()
                .map(|(field, encoded)| (field.to_owned(), number_of(&encoded)))
                .collect();
            (message.to_owned(), numbers)
        })
        .collect();
        assert_eq!(derived, proto_numbers());
    }
}
