//! The shared conformance suite against `RedisStore` on a real three-master Redis Cluster: every
//! script touches one key, so it runs unchanged.

mod common;

idem_core::conformance_tests!(common::Redis { cluster: true });
idem_ops::operator_tests!(common::Redis { cluster: true });
