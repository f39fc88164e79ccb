//! The pages of docs/ whose Rust examples are compiled and run as doctests, one item per page,
//! so that what a page shows is what compiles. docs/http.md and README.md are included from
//! lib.rs, docs/client.md from idem-client (whose API it shows), docs/grpc.md from
//! examples/payments-grpc (whose generated code it uses). Each item names the features its
//! page's examples need; the workspace runs `cargo test -p idem --doc --all-features`.

#[doc = include_str!("../docs/architecture.md")]
pub struct ArchitectureMd;

#[doc = include_str!("../docs/benchmarks.md")]
pub struct BenchmarksMd;

#[cfg(feature = "inbox")]
#[doc = include_str!("../docs/inbox.md")]
pub struct InboxMd;

#[cfg(feature = "metrics")]
#[doc = include_str!("../docs/operations.md")]
pub struct OperationsMd;

#[doc = include_str!("../docs/state-machine.md")]
pub struct StateMachineMd;

#[cfg(all(feature = "sqlite", feature = "postgres"))]
#[doc = include_str!("../docs/stores.md")]
pub struct StoresMd;

#[cfg(feature = "postgres")]
#[doc = include_str!("../docs/unique-constraint.md")]
pub struct UniqueConstraintMd;
