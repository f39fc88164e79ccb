//! A charge: what a client asks for, how it is checked, and what it answers.

use crate::errors::ApiError;
use crate::network::Authorization;
use axum::http::header::CONTENT_TYPE;
use axum::http::HeaderMap;
use idem::StoredResponse;
use serde::Serialize;

/// The largest amount accepted, in the currency's smallest unit (Stripe's eight digits).
pub(crate) const MAX_AMOUNT: i64 = 99_999_999;

/// A charge as requested, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NewCharge {
    pub amount: i64,
    pub currency: String,
    pub description: Option<String>,
}

/// A charge as stored and answered: the record of an authorization of the card network.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Charge {
    pub id: String,
    pub object: &'static str,
    pub amount: i64,
    pub currency: String,
    pub description: Option<String>,
    pub created: i64,
    pub livemode: bool,
    pub paid: bool,
    pub status: &'static str,
    /// The card network's authorization (none on rows written before the network existed).
    pub authorization: Option<String>,
}

impl Charge {
    /// The charge that records `authorization`: its id is derived from the authorization's
    /// (`auth_X` is charged as `ch_X`), so one authorization is one charge row however many
    /// times it is recorded (by the handler, by the reconciler after a crash).
    pub(crate) fn authorized(authorization: &Authorization) -> Self {
        let suffix = authorization
            .id
            .strip_prefix("auth_")
            .unwrap_or(&authorization.id);
        Self::from_row(
            format!("ch_{suffix}"),
            authorization.amount,
            authorization.currency.clone(),
            authorization.description.clone(),
            authorization.created,
            Some(authorization.id.clone()),
        )
    }

    /// A charge read back from the database.
    pub(crate) fn from_row(
        id: String,
        amount: i64,
        currency: String,
        description: Option<String>,
        created: i64,
        authorization: Option<String>,
    ) -> Self {
        Self {
            id,
            object: "charge",
            amount,
            currency,
            description,
            created,
            livemode: false,
            paid: true,
            status: "succeeded",
            authorization,
        }
    }

    /// The 200 answer for it, as stored for the idempotency key (by the handler, or by the
    /// reconciler that settles a charge in doubt: the same bytes for the same row).
    pub(crate) fn response(&self) -> StoredResponse {
        let body = serde_json::to_vec(self).unwrap_or_default();
        StoredResponse::new(200, body).with_header("content-type", "application/json")
    }
}

impl NewCharge {
    /// Parses a form-encoded body (what Stripe's client libraries send) or a JSON one, by the
    /// media type of `Content-Type` as the fingerprint counts it (form when absent, never when
    /// unreadable). Unknown parameters are ignored.
    pub(crate) fn parse(headers: &HeaderMap, body: &[u8]) -> Result<Self, ApiError> {
        let unsupported = || {
            ApiError::invalid(
                "parameter_invalid",
                None,
                "Send the parameters as application/x-www-form-urlencoded or application/json.",
            )
        };
        let media_type = match headers.get(CONTENT_TYPE) {
            None => "application/x-www-form-urlencoded".to_owned(),
            Some(value) => idem::media_type(value.to_str().map_err(|_| unsupported())?),
        };
        let params = match media_type.as_str() {
            "application/json" => Params::json(body)?,
            "application/x-www-form-urlencoded" => Params::form(body)?,
            _ => return Err(unsupported()),
        };
        params.check()
    }
}

/// The parameters as text, whichever encoding they came in.
struct Params {
    amount: Option<String>,
    currency: Option<String>,
    description: Option<String>,
}

impl Params {
    fn form(body: &[u8]) -> Result<Self, ApiError> {
        let pairs: Vec<(String, String)> = serde_urlencoded::from_bytes(body).map_err(|_| {
            ApiError::invalid(
                "parameter_invalid",
                None,
                "The body is not valid form encoding.",
            )
        })?;
        let find = |name: &str| {
            pairs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        };
        Ok(Self {
            amount: find("amount"),
            currency: find("currency"),
            description: find("description"),
        })
    }

    fn json(body: &[u8]) -> Result<Self, ApiError> {
        let value: serde_json::Value = serde_json::from_slice(body).map_err(|_| {
            ApiError::invalid("parameter_invalid", None, "The body is not valid JSON.")
        })?;
        let object = value.as_object().ok_or_else(|| {
            ApiError::invalid("parameter_invalid", None, "The body must be a JSON object.")
        })?;
        let text = |name: &str| -> Result<Option<String>, ApiError> {
            match object.get(name) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
                Some(serde_json::Value::Number(n)) => Ok(Some(n.to_string())),
                Some(_) => Err(ApiError::invalid(
                    "parameter_invalid",
                    None,
                    format!("Invalid {name}: must be a string or a number."),
                )),
            }
        };
        Ok(Self {
            amount: text("amount")?,
            currency: text("currency")?,
            description: text("description")?,
        })
    }

    fn check(self) -> Result<NewCharge, ApiError> {
        let amount = self.amount.ok_or_else(|| {
            ApiError::invalid(
                "parameter_missing",
                Some("amount"),
                "Missing required param: amount.",
            )
        })?;
        let amount: i64 = match amount.parse() {
            Ok(n) if amount.bytes().all(|b| b.is_ascii_digit()) => n,
            _ => return Err(ApiError::invalid(
                "parameter_invalid_integer",
                Some("amount"),
                "Invalid integer: amount must be a positive integer in the smallest currency unit.",
            )),
        };
        if amount < 1 {
            return Err(ApiError::invalid(
                "amount_too_small",
                Some("amount"),
                "Amount must be at least 1.",
            ));
        }
        if amount > MAX_AMOUNT {
            return Err(ApiError::invalid(
                "amount_too_large",
                Some("amount"),
                format!("Amount must be no more than {MAX_AMOUNT}."),
            ));
        }
        let currency = self.currency.ok_or_else(|| {
            ApiError::invalid(
                "parameter_missing",
                Some("currency"),
                "Missing required param: currency.",
            )
        })?;
        if currency.len() != 3 || !currency.bytes().all(|b| b.is_ascii_alphabetic()) {
            return Err(ApiError::invalid(
                "parameter_invalid",
                Some("currency"),
                "Invalid currency: a three-letter ISO code such as usd.",
            ));
        }
        // A NUL cannot be stored (PostgreSQL's text refuses it): a client's error, refused
        // before the card network is called, never a 500 after it authorised.
        if self.description.as_ref().is_some_and(|d| d.contains('\0')) {
            return Err(ApiError::invalid(
                "parameter_invalid",
                Some("description"),
                "The description cannot contain a NUL character.",
            ));
        }
        if self
            .description
            .as_ref()
            .is_some_and(|d| d.chars().count() > 1000)
        {
            return Err(ApiError::invalid(
                "parameter_invalid",
                Some("description"),
                "The description is longer than 1000 characters.",
            ));
        }
        Ok(NewCharge {
            amount,
            currency: currency.to_ascii_lowercase(),
            description: self.description,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(content_type: &str, body: &str) -> Result<NewCharge, ApiError> {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, content_type.parse().expect("value"));
        NewCharge::parse(&headers, body.as_bytes())
    }

    #[test]
    fn form_and_json_bodies_give_the_same_charge() {
        let form = parse(
            "application/x-www-form-urlencoded",
            "amount=4242&currency=USD&description=Tea+for+two",
        )
        .expect("form");
        let json = parse(
            "application/json",
            r#"{"amount":4242,"currency":"usd","description":"Tea for two"}"#,
        )
        .expect("json");
        assert_eq!(form, json);
        assert_eq!(form.currency, "usd");
    }

    /// The body is read under the media type the fingerprint counts (C3): a Content-Type that
    /// is not text is refused, never read as the default form (the same bytes are a 5 000
    /// charge as a form and a 100 one as JSON).
    #[test]
    fn c03_the_parser_is_chosen_by_the_fingerprinted_media_type() {
        let body = r#"{"&amount=5000&currency=usd&x":1,"amount":100,"currency":"usd"}"#;
        let mut headers = HeaderMap::new();
        let unreadable = axum::http::HeaderValue::from_bytes(b"application/json; x=\xff");
        headers.insert(CONTENT_TYPE, unreadable.expect("obs-text is a value"));
        assert!(NewCharge::parse(&headers, body.as_bytes()).is_err());
        let json = parse("Application/JSON ; charset=utf-8", body).expect("json");
        assert_eq!(json.amount, 100);
        assert!(parse("application/jsonx", body).is_err());
    }

    #[test]
    fn one_authorization_is_one_charge_and_one_answer() {
        let authorization = crate::network::Authorization {
            id: "auth_0123456789abcdefghijklmn".into(),
            amount: 4242,
            currency: "usd".into(),
            description: None,
            created: 1_700_000_000,
        };
        let charge = Charge::authorized(&authorization);
        assert_eq!(charge.id, "ch_0123456789abcdefghijklmn");
        assert_eq!(
            charge.authorization.as_deref(),
            Some(authorization.id.as_str())
        );
        // The handler's answer and the reconciler's (from the row) are the same bytes.
        assert_eq!(
            charge.response(),
            Charge::authorized(&authorization).response()
        );
        let body: serde_json::Value =
            serde_json::from_slice(&charge.response().body).expect("json");
        assert_eq!(body["authorization"], "auth_0123456789abcdefghijklmn");
        assert_eq!(body["created"], 1_700_000_000);
    }

    #[test]
    fn bad_amounts_and_currencies_are_400s_naming_the_param() {
        for (body, code) in [
            ("currency=usd", "parameter_missing"),
            ("amount=-5&currency=usd", "parameter_invalid_integer"),
            ("amount=12.5&currency=usd", "parameter_invalid_integer"),
            ("amount=0&currency=usd", "amount_too_small"),
            ("amount=100000000&currency=usd", "amount_too_large"),
            (
                "amount=99999999999999999999&currency=usd",
                "parameter_invalid_integer",
            ),
            ("amount=100", "parameter_missing"),
            ("amount=100&currency=dollars", "parameter_invalid"),
        ] {
            let err = parse("application/x-www-form-urlencoded", body).expect_err(body);
            assert_eq!(
                (err.status.as_u16(), err.code.as_str()),
                (400, code),
                "{body}"
            );
        }
        assert!(parse("application/json", r#"{"amount":1.5,"currency":"usd"}"#).is_err());
        assert!(parse("application/json", "[1]").is_err());
        assert!(parse("text/plain", "amount=1").is_err());
    }
}
