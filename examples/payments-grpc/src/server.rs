//! The tonic server plumbing of `payments.v1.Charges`, written by hand (what tonic's codegen
//! would generate): a tower service that routes each method's path to its handler through
//! `tonic::server::Grpc` and prost's codec.

use crate::charges::Charges;
use crate::db::Backend;
use crate::proto::{
    Charge, CreateChargeRequest, GetChargeRequest, CREATE_CHARGE, GET_CHARGE, SERVICE,
};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tonic::body::Body;
use tonic::server::{Grpc, NamedService, UnaryService};
use tonic::{Request, Response, Status};
use tonic_prost::ProstCodec;

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// `payments.v1.Charges` as a tower service, for `tonic::transport::Server::add_service`.
#[derive(Debug)]
pub struct ChargesServer<B> {
    charges: Arc<Charges<B>>,
}

impl<B> Clone for ChargesServer<B> {
    fn clone(&self) -> Self {
        Self {
            charges: Arc::clone(&self.charges),
        }
    }
}

impl<B: Backend> ChargesServer<B> {
    /// The service over `charges`.
    pub fn new(charges: Charges<B>) -> Self {
        Self {
            charges: Arc::new(charges),
        }
    }
}

impl<B> NamedService for ChargesServer<B> {
    const NAME: &'static str = SERVICE;
}

struct CreateCharge<B>(Arc<Charges<B>>);

impl<B: Backend> UnaryService<CreateChargeRequest> for CreateCharge<B> {
    type Response = Charge;
    type Future = BoxFuture<Result<Response<Charge>, Status>>;

    fn call(&mut self, request: Request<CreateChargeRequest>) -> Self::Future {
        let charges = Arc::clone(&self.0);
        Box::pin(async move { charges.create_charge(request).await })
    }
}

struct GetCharge<B>(Arc<Charges<B>>);

impl<B: Backend> UnaryService<GetChargeRequest> for GetCharge<B> {
    type Response = Charge;
    type Future = BoxFuture<Result<Response<Charge>, Status>>;

    fn call(&mut self, request: Request<GetChargeRequest>) -> Self::Future {
        let charges = Arc::clone(&self.0);
        Box::pin(async move { charges.get_charge(request).await })
    }
}

impl<B: Backend> tower::Service<http::Request<Body>> for ChargesServer<B> {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<http::Response<Body>, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let charges = Arc::clone(&self.charges);
        match request.uri().path() {
            CREATE_CHARGE => Box::pin(async move {
                let mut grpc = Grpc::new(ProstCodec::<Charge, CreateChargeRequest>::default());
                Ok(grpc.unary(CreateCharge(charges), request).await)
            }),
            GET_CHARGE => Box::pin(async move {
                let mut grpc = Grpc::new(ProstCodec::<Charge, GetChargeRequest>::default());
                Ok(grpc.unary(GetCharge(charges), request).await)
            }),
            _ => Box::pin(async { Ok(Status::unimplemented("no such method").into_http()) }),
        }
    }
}
