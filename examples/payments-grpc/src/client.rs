//! A client of `payments.v1.Charges`, written by hand over `tonic::client::Grpc` (what tonic's
//! codegen would generate).

use crate::proto::{Charge, CreateChargeRequest, GetChargeRequest, CREATE_CHARGE, GET_CHARGE};
use http::uri::PathAndQuery;
use tonic::client::Grpc;
use tonic::transport::Channel;
use tonic::{IntoRequest, Response, Status};
use tonic_prost::ProstCodec;

/// A `payments.v1.Charges` client on a tonic channel.
#[derive(Clone, Debug)]
pub struct ChargesClient {
    grpc: Grpc<Channel>,
}

impl ChargesClient {
    /// A client over `channel`.
    pub fn new(channel: Channel) -> Self {
        Self {
            grpc: Grpc::new(channel),
        }
    }

    /// Connects to `url` (`http://127.0.0.1:PORT`).
    pub async fn connect(url: String) -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        Ok(Self::new(Channel::from_shared(url)?.connect().await?))
    }

    /// `CreateCharge`.
    pub async fn create_charge(
        &mut self,
        request: impl IntoRequest<CreateChargeRequest>,
    ) -> Result<Response<Charge>, Status> {
        self.unary(request.into_request(), CREATE_CHARGE).await
    }

    /// `GetCharge`.
    pub async fn get_charge(
        &mut self,
        request: impl IntoRequest<GetChargeRequest>,
    ) -> Result<Response<Charge>, Status> {
        self.unary(request.into_request(), GET_CHARGE).await
    }

    async fn unary<M: prost::Message + Send + Sync + 'static>(
        &mut self,
        request: tonic::Request<M>,
        path: &'static str,
    ) -> Result<Response<Charge>, Status> {
        self.grpc
            .ready()
            .await
            .map_err(|e| Status::unavailable(format!("the channel is not ready: {e}")))?;
        let codec = ProstCodec::<M, Charge>::default();
        self.grpc
            .unary(request, PathAndQuery::from_static(path), codec)
            .await
    }
}
