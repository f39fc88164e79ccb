//! The server: the charges service behind idem's gRPC layer, on SQLite or PostgreSQL.

use crate::charges::{Charges, ACCOUNT};
use crate::db::Backend;
use crate::proto::charges_server::ChargesServer;
use crate::proto::CreateChargeRequest;
use idem::Idempotency;
use idem_tower::{ConsumerError, GrpcIdempotencyLayer, GrpcMethod};
use prost::Message;
use std::future::Future;
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tonic::transport::Server;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The path of `CreateCharge`, the method the layer protects.
pub const CREATE_CHARGE: &str = "/payments.v1.Charges/CreateCharge";

/// The AIP-155 key of an encoded `CreateChargeRequest`: its `request_id`, when set.
///
/// ```
/// use payments_grpc::app::request_id;
/// use payments_grpc::proto::CreateChargeRequest;
/// use prost::Message;
/// let request = CreateChargeRequest { amount: 1, request_id: "req-1".into(), ..Default::default() };
/// assert_eq!(request_id(&request.encode_to_vec()).as_deref(), Some("req-1"));
/// ```
pub fn request_id(message: &[u8]) -> Option<String> {
    let request = CreateChargeRequest::decode(message).ok()?;
    (!request.request_id.is_empty()).then_some(request.request_id)
}

/// How the layer finds a call's consumer.
pub type Consumer = fn(&http::request::Parts) -> Result<String, ConsumerError>;

/// The consumer a key belongs to: the `x-account` metadata entry.
pub fn account(request: &http::request::Parts) -> Result<String, ConsumerError> {
    request
        .headers
        .get(ACCOUNT)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
        .ok_or_else(ConsumerError::unauthenticated)
}

/// The gRPC layer: `CreateCharge` protected, its key the request's `request_id` (AIP-155) or
/// the `idempotency-key` metadata entry (both sent and different: `INVALID_ARGUMENT`), a
/// message that does not decode as a `CreateChargeRequest` refused before anything is recorded;
/// `GetCharge` passes through.
pub fn layer<S>(idem: Idempotency<S>) -> GrpcIdempotencyLayer<S, Consumer> {
    let account: Consumer = account;
    GrpcIdempotencyLayer::new(idem, account).method(
        GrpcMethod::unary(CREATE_CHARGE)
            .message::<CreateChargeRequest>()
            .key_from_message(request_id),
    )
}

/// Serves on `listener` until `shutdown` resolves, then waits for executions still running.
pub async fn serve<B: Backend>(
    backend: B,
    listener: TcpListener,
    test_hooks: bool,
    shutdown: impl Future<Output = ()>,
) -> Result<(), BoxError> {
    let idem = backend.idem().clone();
    let charges = ChargesServer::new(Charges::new(backend, test_hooks));
    Server::builder()
        .layer(layer(idem.clone()))
        .add_service(charges)
        .serve_with_incoming_shutdown(TcpIncoming::from(listener), shutdown)
        .await?;
    idem.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::charges_server::SERVICE_NAME;

    #[test]
    fn create_charge_is_a_method_of_the_generated_service() {
        assert_eq!(CREATE_CHARGE, format!("/{SERVICE_NAME}/CreateCharge"));
    }
}
