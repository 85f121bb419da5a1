//! gRPC clients of a test server: one channel, and the services' clients over it.

use pgvs3::grpc::proto::ojs::v1::ojs_service_client::OjsServiceClient;
use pgvs3::grpc::proto::pgvs3::v1::admin_service_client::AdminServiceClient;
use pgvs3::grpc::proto::pgvs3::v1::stream_service_client::StreamServiceClient;
use tonic::transport::Channel;

/// A client of `ojs.v1.OJSService`.
pub type Ojs = OjsServiceClient<Channel>;
/// A client of `pgvs3.v1.AdminService`.
pub type Admin = AdminServiceClient<Channel>;
/// A client of `pgvs3.v1.StreamService`.
pub type Streams = StreamServiceClient<Channel>;

/// A connected channel to the server at `url` (`http://host:port`).
pub async fn channel(url: &str) -> Channel {
    Channel::from_shared(url.to_string())
        .expect("a valid gRPC URL")
        .connect()
        .await
        .expect("connect gRPC")
}

/// A client of `ojs.v1.OJSService` at `url`.
pub async fn ojs(url: &str) -> Ojs {
    OjsServiceClient::new(channel(url).await)
}

/// A client of `pgvs3.v1.AdminService` at `url`.
pub async fn admin(url: &str) -> Admin {
    AdminServiceClient::new(channel(url).await)
}

/// A client of `pgvs3.v1.StreamService` at `url`.
pub async fn streams(url: &str) -> Streams {
    StreamServiceClient::new(channel(url).await)
}
